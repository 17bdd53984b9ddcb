"""NCCL Inspector JSON lines: tail ``<dir>/<host>-pid<pid>.log`` files and parse them.

The Inspector (an NCCL >= 2.28 profiler plugin) writes one JSON object per line: ``header``
(communicator hash ``id``, ``rank`` within the communicator, ``n_ranks``, ``nnodes``, newer
versions ``comm_name``), ``metadata`` (``hostname``, ``pid``, ``dump_timestamp_us``, ...) and either
``coll_perf`` (``coll``, ``coll_sn``, ``coll_msg_size_bytes``, ``coll_exec_time_us``,
``coll_timing_source``, ``coll_algobw_gbs``, ``coll_busbw_gbs``) or ``p2p_perf`` (the same under a
``p2p_`` prefix, plus ``p2p_peer``). Its dump thread writes, per communicator and per interval, the
*last* operation completed since the previous write (NCCL 2.28/2.29; later versions write every
op of at least 8 KiB): the records are a sample, and ``coll_sn`` gaps are normal. ``coll_sn``
counts each op type on its own (NCCL's ``seqNumber[func]``): an AllGather and an AllReduce of
one communicator can both be number 0 (read from the plugin's source, v2.28.9-1).
``coll_timing_source`` ``kernel_gpu`` means the time is the kernels' own GPU execution;
``dump_timestamp_us`` is when the line was written, not when the op ran. The plugin writes nothing unless
``NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS`` is set (its dump thread is the only writer).

Each file is followed with :class:`perfd.collectors.megatron.tail.LogTail` (complete lines only,
truncation and rotation handled); new files are picked up by rescanning the directory. A line that
cannot be used is counted by reason and skipped, never fatal.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from perfd.collectors.megatron.tail import LogTail
from perfd.core.model import CollectiveRecord, ParseIssue, Provenance

# NCCL function names (ncclFuncToString) -> canonical op names shared with Flight Recorder.
INSPECTOR_OPS: dict[str, str] = {
    "AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast", "Reduce": "reduce", "Send": "send", "Recv": "recv",
    "SendRecv": "send_recv", "AllToAll": "all_to_all", "All2All": "all_to_all", "Gather": "gather",
    "Scatter": "scatter", "AllGatherV": "all_gather_v",
}
# NCCL 2.28's plugin prints "Invalid" for ops its name table lacks (AlltoAll, Gather, Scatter):
# kept as a record of an unknown op (its time is real), counted as ``unknown_op``.
UNKNOWN_OP_NAMES = frozenset({"Invalid", "Unknown"})
# NCCL 2.28's plugin has no type size for uint8/bool and multiplies the count by -1: a size that
# reads as >= 2**63 is that, not a real size (it stays unknown).
MAX_PLAUSIBLE_BYTES = 1 << 62


_PER_RANK_SIZE_OPS = frozenset({"all_gather", "reduce_scatter"})


def bus_bw_factor(op: str, n: int) -> float | None:
    """nccl-tests' bus-bandwidth factor for a canonical op on ``n`` ranks; None if unknown.

    all-reduce 2(n-1)/n (each byte is reduced and then broadcast: two passes of (n-1)/n);
    all-gather, reduce-scatter and all-to-all (n-1)/n (each rank moves the share it does not hold);
    broadcast, reduce and point-to-point 1. None on one rank (or none): no data crosses a link, so
    there is no bus bandwidth to speak of (bytes ÷ a local copy's time would read as a link far
    beyond any real one).
    """
    if n <= 1:
        return None
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "send", "recv", "send_recv"):
        return 1.0
    return None


def algbw_gbs(nbytes: float, time_us: float) -> float | None:
    """Algorithm bandwidth, GB/s (1e9 bytes/s) as nccl-tests and the Inspector report it."""
    if time_us <= 0:
        return None
    return nbytes / (time_us * 1e-6) / 1e9


def expected_busbw_gbs(op: str, nbytes: float, time_us: float, n: int) -> float | None:
    alg = algbw_gbs(nbytes, time_us)
    factor = bus_bw_factor(op, n)
    return None if alg is None or factor is None else alg * factor


def check_busbw(op: str, nbytes: float, time_us: float, n: int, reported_gbs: float,
                rel_tol: float = 0.01) -> bool | None:
    """Recompute bus bandwidth from size, time and n; does the reported value agree?

    The Inspector prints the time in whole microseconds but may compute bandwidth from the exact
    time, so any time in [t-1, t+1] us is accepted (plus ``rel_tol``), and it prints bandwidth with
    six decimals, so half of that last digit is accepted too (a real 8-byte all-gather in 4,139 µs
    printed 0.000002). None: cannot be checked (unknown op, zero time).
    """
    if time_us <= 0 or bus_bw_factor(op, n) is None or not math.isfinite(reported_gbs):
        return None
    hi = expected_busbw_gbs(op, nbytes, max(time_us - 1.0, 0.5), n)
    lo = expected_busbw_gbs(op, nbytes, time_us + 1.0, n)
    assert hi is not None and lo is not None
    printed = 5e-7
    return lo * (1 - rel_tol) - printed <= reported_gbs <= hi * (1 + rel_tol) + printed


class InspectorLineError(ValueError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _num(d: Mapping[str, object], key: str, required: bool = True) -> float | None:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        if required:
            raise InspectorLineError(f"bad-field:{key}")
        return None
    return float(v)


def _int(d: Mapping[str, object], key: str, required: bool = True) -> int | None:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        if required:
            raise InspectorLineError(f"bad-field:{key}")
        return None
    return v


def parse_line(line: str, job: str, source: str = "") -> CollectiveRecord:
    """One Inspector JSON line -> CollectiveRecord; raises :class:`InspectorLineError`."""
    try:
        obj = json.loads(line)
    except ValueError:
        raise InspectorLineError("not-json") from None
    if not isinstance(obj, dict):
        raise InspectorLineError("not-an-object")
    header, meta = obj.get("header"), obj.get("metadata")
    if not isinstance(header, dict):
        raise InspectorLineError("no-header")
    if not isinstance(meta, dict):
        meta = {}
    if isinstance(obj.get("coll_perf"), dict):
        perf, pre, is_p2p = obj["coll_perf"], "coll", False
    elif isinstance(obj.get("p2p_perf"), dict):
        perf, pre, is_p2p = obj["p2p_perf"], "p2p", True
    else:
        raise InspectorLineError("no-perf")
    raw_op = perf.get(pre)
    if not isinstance(raw_op, str) or not raw_op:
        raise InspectorLineError(f"bad-field:{pre}")
    op = "unknown" if raw_op in UNKNOWN_OP_NAMES else INSPECTOR_OPS.get(raw_op, raw_op.lower())
    sn = _int(perf, f"{pre}_sn")
    size = _int(perf, f"{pre}_msg_size_bytes")
    if size is not None and not 0 <= size < MAX_PLAUSIBLE_BYTES:
        size = None  # see MAX_PLAUSIBLE_BYTES; the bandwidths printed with it are as wrong
        perf = {k: v for k, v in perf.items() if not k.endswith(("_algobw_gbs", "_busbw_gbs"))}
    exec_us = _num(perf, f"{pre}_exec_time_us")
    n_ranks = _int(header, "n_ranks", required=False)
    comm_id = header.get("id")
    comm_name = header.get("comm_name")
    ts_us = _int(meta, "dump_timestamp_us", required=False)
    host = meta.get("hostname")
    timing = perf.get(f"{pre}_timing_source")
    nbytes = size
    if op in _PER_RANK_SIZE_OPS and n_ranks and size is not None:
        # The plugin prints NCCL's count x type size: for all-gather and reduce-scatter that is one
        # rank's chunk, and its own bandwidth uses size x n_ranks. perfd's ``bytes`` is the
        # nccl-tests size (the full buffer), as for Flight Recorder records.
        nbytes = size * n_ranks
    return CollectiveRecord(
        job=job, source="nccl_inspector", op=op, raw_op=raw_op,
        comm_id=comm_id if isinstance(comm_id, str) else None,
        pg_name=comm_name if isinstance(comm_name, str) else None,
        group_rank=_int(header, "rank", required=False), group_size=n_ranks,
        nnodes=_int(header, "nnodes", required=False),
        collective_seq_id=None if is_p2p else sn, p2p_seq_id=sn if is_p2p else None, is_p2p=is_p2p,
        peer=_int(perf, "p2p_peer", required=False) if is_p2p else None,
        bytes=nbytes, duration_ms=exec_us / 1000.0 if exec_us is not None else None,
        algbw_gbs=_num(perf, f"{pre}_algobw_gbs", required=False),
        busbw_gbs=_num(perf, f"{pre}_busbw_gbs", required=False),
        timing_source=timing if isinstance(timing, str) else None,
        time_completed_ns=ts_us * 1000 if ts_us is not None else None,
        host=host if isinstance(host, str) else None, pid=_int(meta, "pid", required=False),
        provenance=Provenance("nccl", f"inspector:{source}") if source else None,
    )


@dataclass
class _File:
    tail: LogTail
    line_no: int = 0


class InspectorReader:
    """Follows every ``*.log`` file in an Inspector dump directory. Never raises.

    ``read()`` returns new records; problems are in ``counts`` (``malformed:<reason>``,
    ``duplicate``, ``busbw_mismatch``, ...) and the last ``max_issues`` lines are kept in ``issues``.
    """

    def __init__(self, directory: str | Path, job: str, from_start: bool = True, rescan_s: float = 5.0,
                 max_files: int = 4096, max_bytes_per_file: int = 1 << 20, max_issues: int = 100,
                 check_bandwidth: bool = True) -> None:
        self.dir = Path(directory)
        self.job = job
        self.rescan_s = rescan_s
        self.max_files = max_files
        self.max_bytes = max_bytes_per_file
        self.max_issues = max_issues
        self.check_bandwidth = check_bandwidth
        self.counts: dict[str, int] = {}
        self.issues: list[ParseIssue] = []
        self._files: dict[str, _File] = {}
        self._last_sn: dict[tuple[str, str, int | None, bool, str], int] = {}
        self._next_scan = 0.0
        self._gone: set[str] = set()
        # Files present now: read from their start, or skip what they hold (from_start=False).
        self._scan(at_start=True, from_start=from_start)
        self._next_scan = time.monotonic() + rescan_s

    def _c(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def _scan(self, at_start: bool = False, from_start: bool = True) -> None:
        try:
            names = sorted(e.name for e in os.scandir(self.dir) if e.name.endswith(".log") and e.is_file())
        except FileNotFoundError:
            self._c("dir_missing")  # the job has not started yet, or the path is wrong
            return
        except OSError:
            self._c("dir_unreadable")
            return
        present = set(names)
        # A deleted file is still open: read() drains what was written before it goes.
        self._gone.update(n for n in self._files if n not in present)
        for name in names:
            if name in self._files:
                continue
            if len(self._files) >= self.max_files:
                self._c("files_over_limit")
                break
            # A file that appears after start is new: read it from its first line.
            self._files[name] = _File(LogTail(self.dir / name, from_start=from_start or not at_start))
            self._c("files")

    def read(self, now: float | None = None) -> list[CollectiveRecord]:
        mono = time.monotonic() if now is None else now
        if mono >= self._next_scan:
            self._scan()
            self._next_scan = mono + self.rescan_s
        out: list[CollectiveRecord] = []
        for name, f in self._files.items():
            for line in f.tail.read_lines(self.max_bytes):
                f.line_no += 1
                self._line(name, f.line_no, line, out)
        for name in self._gone:
            gone = self._files.pop(name, None)
            if gone is not None:
                gone.tail.close()
                self._c("files_gone")
        self._gone.clear()
        return out

    def _line(self, name: str, line_no: int, line: str, out: list[CollectiveRecord]) -> None:
        text = line.strip()
        if not text:
            return
        try:
            rec = parse_line(text, self.job, f"{name}:{line_no}")
        except InspectorLineError as exc:
            self._c(f"malformed:{exc.reason}")
            if len(self.issues) >= self.max_issues:
                self.issues.pop(0)
            self.issues.append(ParseIssue(line_no, exc.reason, text[:200]))
            return
        if rec.op == "unknown":
            self._c("unknown_op")
        elif rec.bytes is None:
            self._c("implausible_size")
        seq = rec.p2p_seq_id if rec.is_p2p else rec.collective_seq_id
        # Sequence numbers are per communicator, rank and op type (NCCL's seqNumber[func]).
        key = (name, rec.comm_id or "", rec.group_rank, rec.is_p2p, rec.raw_op or rec.op)
        if seq is not None:
            last = self._last_sn.get(key)
            if last is not None and seq <= last:
                self._c("duplicate")
                return
            self._last_sn[key] = seq
        if self.check_bandwidth and rec.busbw_gbs is not None and rec.bytes is not None \
                and rec.duration_ms is not None and rec.group_size:
            n = 2 if rec.is_p2p else rec.group_size
            ok = check_busbw(rec.op, rec.bytes, rec.duration_ms * 1000.0, n, rec.busbw_gbs)
            if ok is False:
                self._c("busbw_mismatch")
        self._c("records")
        out.append(rec)

    def close(self) -> None:
        for f in self._files.values():
            f.tail.close()
        self._files.clear()
