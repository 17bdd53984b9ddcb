"""Read an nsys capture: the SQLite export (stdlib sqlite3), exporting a ``.nsys-rep`` first.

Tables used (``nsys export --type sqlite``; any of them may be missing — a capture without NVTX or
without copies is normal):

- ``CUPTI_ACTIVITY_KIND_KERNEL(start, end, deviceId, streamId, globalPid, shortName, demangledName)``
  with the names as ids into ``StringIds(id, value)``;
- ``CUPTI_ACTIVITY_KIND_MEMCPY`` / ``CUPTI_ACTIVITY_KIND_MEMSET(start, end, deviceId, streamId)``;
- ``NVTX_EVENTS(start, end, text, textId, globalTid)``: ranges only (marks have no end);
- ``CUPTI_ACTIVITY_KIND_RUNTIME(start, end, globalTid, correlationId, nameId)``: the CUDA API calls;
  a kernel's ``correlationId`` is the call that launched it, and the NVTX ranges open on that call's
  thread at its start are the ops around it (perfd.capture.ops charges the kernel to them). PyTorch's
  ``torch.autograd.profiler.emit_nvtx()`` names its ranges after the ops, with autograd's sequence
  number appended (``aten::mm, seq = 7``; a backward node's ``..., stashed seq = 7``), which links a
  backward node to its forward op as Kineto's flows do.

Times are nanoseconds. ``globalPid``/``globalTid`` carry the process id in bits 24..47, which is
how NVTX ranges (recorded per thread) are matched to the devices a process ran kernels on.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
from collections.abc import Sequence
from pathlib import Path

from perfd.analytics.breakdown.device_breakdown import CaptureAnalysis
from perfd.analytics.breakdown.op_parts import is_profiler_step
from perfd.capture.analysis import NvtxRange, TraceData, analyze_trace
from perfd.capture.binaries import find_nsys
from perfd.capture.chrome_trace import SYNC_CALLS
from perfd.capture.ops import HostRange, Launch, RangeKind
from perfd.capture.step_marks import optimizer_marks
from perfd.capture.timeline_events import KernelEvent, MemEvent

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX = "NVTX_EVENTS"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
STRINGS = "StringIds"
# emit_nvtx's range names: the op, then ", seq = N" (or ", stashed seq = N" on a backward node) and
# sometimes ", sizes = [...]"
_SEQ = re.compile(r",\s*(?:stashed )?seq = (\d+)")

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


class NsysExportError(RuntimeError):
    pass


def export_sqlite(report: str | Path, out: str | Path | None = None, nsys: str | None = None,
                  timeout_s: float = 900.0) -> Path:
    """``nsys export --type sqlite -o OUT REPORT``; OUT defaults to REPORT with a .sqlite suffix.

    An argument list, never a shell string: paths come from capture metadata.
    """
    rep = Path(report)
    dest = Path(out) if out is not None else rep.with_suffix(".sqlite")
    exe = nsys or find_nsys()
    cmd = [exe, "export", "--type", "sqlite", "--force-overwrite=true", "-o", str(dest), str(rep)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NsysExportError(f"{' '.join(cmd)}: {e}") from e
    if res.returncode != 0 or not dest.is_file():
        tail = (res.stderr or res.stdout).strip()[-2000:]
        raise NsysExportError(f"{' '.join(cmd)} exited {res.returncode}: {tail}")
    return dest


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


# A kernel launch's grid and block, as nsys exports them
_DIMS = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")


def _dim3(v: Sequence[object]) -> tuple[int, int, int] | None:
    if len(v) != 3:
        return None
    x, y, z = v
    if not (isinstance(x, int) and isinstance(y, int) and isinstance(z, int)):
        return None
    return int(x), int(y), int(z)


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    # Table names come from our constants, never from input: safe to format in.
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def _pid(global_id: int | None) -> int | None:
    return None if global_id is None else (int(global_id) >> 24) & 0xFFFFFF


def _connect(path: str | Path) -> sqlite3.Connection:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such capture export: {p}")
    # Read-only: an analysis must never modify the evidence.
    return sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)


# CUPTI_ActivityMemcpyKind, as nsys exports it (the names Kineto gives the same copies)
_COPY_KINDS = {1: "Memcpy HtoD (Host -> Device)", 2: "Memcpy DtoH (Device -> Host)",
               8: "Memcpy DtoD (Device -> Device)", 9: "Memcpy HtoH (Host -> Host)",
               10: "Memcpy PtoP (Device -> Device)"}


def read_nsys_sqlite(path: str | Path) -> TraceData:
    """Kernels, copies/memsets and NVTX ranges of an nsys SQLite export."""
    con = _connect(path)
    try:
        tables = _tables(con)
        has_strings = STRINGS in tables
        data = TraceData(source=str(path))
        if KERNEL in tables:
            cols = _columns(con, KERNEL)
            name_cols = [c for c in ("shortName", "demangledName") if c in cols]
            joins, picks = "", []
            for i, c in enumerate(name_cols):
                if has_strings:
                    joins += f" LEFT JOIN {STRINGS} s{i} ON s{i}.id = k.{c}"
                    picks.append(f"s{i}.value")
                else:
                    picks.append(f"CAST(k.{c} AS TEXT)")
            name_sql = f"COALESCE({', '.join(picks)}, '?')" if picks else "'?'"
            stream = "k.streamId" if "streamId" in cols else "NULL"
            gpid = "k.globalPid" if "globalPid" in cols else "NULL"
            corr = "k.correlationId" if "correlationId" in cols else "NULL"
            dims = ", ".join(f"k.{d}" if d in cols else "NULL" for d in _DIMS)
            q = (f"SELECT k.start, k.end, k.deviceId, {stream}, {gpid}, {name_sql}, {corr}, {dims} "
                 f"FROM {KERNEL} k{joins} "
                 "WHERE k.end IS NOT NULL")
            data.kernels = [KernelEvent(int(dev), float(s), float(e), str(name), stream_id, _pid(gp),
                                        int(c) if c is not None else None, _dim3(d[:3]), _dim3(d[3:]))
                            for s, e, dev, stream_id, gp, name, c, *d in con.execute(q)]
        for table, kind in ((MEMCPY, "memcpy"), (MEMSET, "memset")):
            if table not in tables:
                continue
            cols = _columns(con, table)
            stream = "streamId" if "streamId" in cols else "NULL"
            gpid = "globalPid" if "globalPid" in cols else "NULL"
            copy = "copyKind" if "copyKind" in cols else "NULL"
            corr = "correlationId" if "correlationId" in cols else "NULL"
            q = (f"SELECT start, end, deviceId, {stream}, {gpid}, {copy}, {corr} FROM {table} "
                 "WHERE end IS NOT NULL")
            data.memcpys.extend(MemEvent(int(dev), float(s), float(e), kind, stream_id, _pid(gp),
                                         name=_COPY_KINDS.get(ck, "Memcpy") if kind == "memcpy" else "Memset",
                                         corr=int(c) if c is not None else None)
                                for s, e, dev, stream_id, gp, ck, c in con.execute(q))
        if NVTX in tables:
            data.nvtx = _read_nvtx(con, has_strings)
            data.ranges = _host_ranges(con, has_strings)
            # one kind counts the steps, as in a Kineto trace: the profiler's, else torch.optim's outermost
            data.steps = (sum(1 for r in data.ranges if is_profiler_step(r.name))
                          or len(optimizer_marks(data.ranges)) or None)
        if RUNTIME in tables:
            data.launches, data.syncs = _runtime_calls(con, has_strings)
        return data
    finally:
        con.close()


def _nvtx_rows(con: sqlite3.Connection, has_strings: bool, zero_length: bool
               ) -> list[tuple[float, float, str, int | None]]:
    """(start, end, text, globalTid) of the NVTX ranges (marks and registrations have no end);
    ``zero_length``: ranges that start and end at once too (an op emit_nvtx timed at 0 ns)."""
    cols = _columns(con, NVTX)
    picks = ["e.text"] if "text" in cols else []
    join = ""
    if "textId" in cols and has_strings:
        join = f" LEFT JOIN {STRINGS} t ON t.id = e.textId"
        picks.append("t.value")
    name_sql = f"COALESCE({', '.join(picks)}, '?')" if picks else "'?'"
    tid = "e.globalTid" if "globalTid" in cols else "NULL"
    q = (f"SELECT e.start, e.end, {name_sql}, {tid} FROM {NVTX} e{join} "
         f"WHERE e.end IS NOT NULL AND e.end {'>=' if zero_length else '>'} e.start")
    return [(float(s), float(e), str(name), gt) for s, e, name, gt in con.execute(q)]


def _read_nvtx(con: sqlite3.Connection, has_strings: bool) -> list[NvtxRange]:
    return [NvtxRange(s, e, name, None, _pid(gt)) for s, e, name, gt in _nvtx_rows(con, has_strings, False)]


def _tid(global_tid: int | None) -> int | None:
    return None if global_tid is None else int(global_tid) & 0xFFFFFF


def _host_ranges(con: sqlite3.Connection, has_strings: bool) -> list[HostRange]:
    """NVTX ranges as host ranges on their threads: an op where emit_nvtx named it (``aten::...``, an
    autograd node ``...Backward0``, an autograd Function), else an annotation."""
    out = []
    for s, e, raw, gt in _nvtx_rows(con, has_strings, True):
        tid = _tid(gt)
        if tid is None:
            continue
        text = str(raw)
        m = _SEQ.search(text)
        name = text.split(",", 1)[0].strip() if m or ", sizes = " in text else text
        op = "::" in name or name.endswith(("Backward0", "Backward1", "Backward")) or name.startswith(
            "autograd::")
        out.append(HostRange(tid, s, e, name, RangeKind.OP if op else RangeKind.ANNOTATION,
                             int(m.group(1)) if m else None))
    return out


def _runtime_calls(con: sqlite3.Connection, has_strings: bool) -> tuple[list[Launch], list[Launch]]:
    """(launches by correlation id, synchronising calls) of the CUDA runtime API table."""
    cols = _columns(con, RUNTIME)
    if not {"start", "end", "globalTid", "correlationId"} <= cols:
        return [], []
    name = (f"(SELECT value FROM {STRINGS} WHERE id = r.nameId)" if has_strings and "nameId" in cols
            else "''")
    launches, syncs = [], []
    for s, e, gt, corr, n in con.execute(f"SELECT r.start, r.end, r.globalTid, r.correlationId, {name} "
                                         f"FROM {RUNTIME} r WHERE r.end IS NOT NULL"):
        tid = _tid(gt)
        if tid is None:
            continue
        call = str(n or "").split("_v")[0]  # nsys names versioned entry points: cudaLaunchKernel_v7000
        if corr is not None:
            launches.append(Launch(int(corr), tid, float(s), call, float(e)))
        if call in SYNC_CALLS:
            syncs.append(Launch(int(corr or 0), tid, float(e), call))
    return launches, syncs


def read_nsys_trace(path: str | Path, sqlite_out: str | Path | None = None) -> TraceData:
    """The events of an nsys capture: a SQLite export, or a report exported first (an up-to-date
    export next to the report is reused)."""
    p = Path(path)
    if p.suffix in REPORT_SUFFIXES:
        dest = Path(sqlite_out) if sqlite_out is not None else p.with_suffix(".sqlite")
        if not (dest.is_file() and dest.stat().st_mtime >= p.stat().st_mtime):
            dest = export_sqlite(p, dest)
        p = dest
    data = read_nsys_sqlite(p)
    data.source = str(path)
    return data


def analyze_nsys(path: str | Path, sqlite_out: str | Path | None = None, top_n: int = 10) -> CaptureAnalysis:
    """Breakdown of an nsys capture (read_nsys_trace)."""
    return analyze_trace(read_nsys_trace(path, sqlite_out), top_n)


# --- the direct SQL cross-check ---------------------------------------------------------------
# Busy time as a union computed in SQL alone (gaps-and-islands with window functions), so it shares
# no code with analysis.union(): a kernel starts a new island when it starts after every earlier
# kernel of its device has ended.
_UNION_SQL = """
WITH k AS ({source}),
m AS (SELECT d, s, e, MAX(e) OVER (PARTITION BY d ORDER BY s, e
        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end FROM k),
g AS (SELECT d, s, e, SUM(CASE WHEN prev_end IS NULL OR s > prev_end THEN 1 ELSE 0 END)
        OVER (PARTITION BY d ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island FROM m)
SELECT d, SUM(len) FROM (SELECT d, MAX(e) - MIN(s) AS len FROM g GROUP BY d, island) GROUP BY d
"""


def direct_sql_check(sqlite_path: str | Path) -> dict[str, object]:
    """Per device, with plain SQL and no Python interval code: kernel count, SUM(end-start) of all
    and of NCCL kernels, per-stream sums (on one stream kernels never overlap, so a single-stream
    device's busy time must equal its sum), and the busy / NCCL unions via window functions.

    ``{"devices": {dev: {...ms...}}}``; compare with :func:`analyze_nsys` (the 1% accuracy check).
    """
    con = _connect(sqlite_path)
    try:
        tables = _tables(con)
        out: dict[int, dict[str, object]] = {}
        if KERNEL not in tables:
            return {"devices": {}}
        name = "(SELECT value FROM StringIds WHERE id = k.shortName)" if STRINGS in tables else "''"
        nccl = f"LOWER({name}) LIKE '%nccl%'"
        q = (f"SELECT k.deviceId, COUNT(*), SUM(k.end - k.start), "
             f"SUM(CASE WHEN {nccl} THEN k.end - k.start ELSE 0 END), "
             f"SUM(CASE WHEN {nccl} THEN 0 ELSE k.end - k.start END), MIN(k.start), MAX(k.end) "
             f"FROM {KERNEL} k WHERE k.end IS NOT NULL GROUP BY k.deviceId")
        for dev, n, total_ns, nccl_ns, other_ns, first, last in con.execute(q):
            out[int(dev)] = {"kernel_count": n, "kernel_sum_ms": total_ns / 1e6, "nccl_sum_ms": nccl_ns / 1e6,
                             "non_nccl_sum_ms": other_ns / 1e6, "kernel_span_ms": (last - first) / 1e6,
                             "streams": {}}
        for dev, stream, n, total_ns in con.execute(
                f"SELECT deviceId, streamId, COUNT(*), SUM(end - start) FROM {KERNEL} "
                "WHERE end IS NOT NULL GROUP BY deviceId, streamId"):
            streams = out[int(dev)]["streams"]
            assert isinstance(streams, dict)
            streams[int(stream)] = {"kernel_count": n, "kernel_sum_ms": total_ns / 1e6}
        def rows(table: str, where: str = "") -> str:
            return (f"SELECT k.deviceId AS d, k.start AS s, k.end AS e FROM {table} AS k "
                    f"WHERE k.end IS NOT NULL {where}")

        # busy = every GPU activity (kernels, copies, sets); the kernels' own union beside it
        activity = " UNION ALL ".join(rows(t) for t in (KERNEL, MEMCPY, MEMSET) if t in tables)
        for key, source in (("busy_union_ms", activity), ("kernel_union_ms", rows(KERNEL)),
                            ("nccl_union_ms", rows(KERNEL, f"AND {nccl}"))):
            for dev, ns in con.execute(_UNION_SQL.format(source=source)):
                if int(dev) in out:
                    out[int(dev)][key] = ns / 1e6
        for dev_stats in out.values():
            dev_stats.setdefault("nccl_union_ms", 0.0)
        return {"devices": out}
    finally:
        con.close()
