"""PyTorch Flight Recorder dumps: a restricted unpickler, entry parsing, dedupe, hang detection.

A dump is a pickle of a plain dict (``version``, ``pg_config``, ``pg_status``, ``entries``, ...)
written by the C++ side of ProcessGroupNCCL (torch's own pickler: only containers, strings,
numbers, None and booleans; a real dump holds no GLOBAL opcode at all). The file is input, not code,
so it is loaded by :class:`RestrictedUnpickler`, which refuses every global except ``set`` and
``frozenset`` (what ``pickle`` needs for those containers at protocols 2-3). Anything else raises
:class:`RefusedGlobal` before it can be called.

Nothing here imports torch.
"""

from __future__ import annotations

import builtins
import io
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from perfd.collectors.nccl.inspector import bus_bw_factor
from perfd.core.model import CollectiveRecord, Provenance

MAX_DUMP_BYTES = 256 << 20  # 2,000 entries with Python stacks are a few MB; refuse absurd files

# torch dtype name (c10::ScalarType, as Flight Recorder prints it) -> bytes per element.
DTYPE_BYTES: dict[str, int] = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "ComplexHalf": 4, "ComplexFloat": 8,
    "ComplexDouble": 16, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1, "Bool": 1,
    "UInt16": 2, "UInt32": 4, "UInt64": 8, "Int1": 1, "UInt1": 1,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
    "Float8_e8m0fnu": 1, "Float4_e2m1fn_x2": 1, "QInt8": 1, "QUInt8": 1, "QInt32": 4,
}

# Flight Recorder op names vary across torch versions and call paths ("all_reduce",
# "allreduce_coalesced", "_all_gather_base", "_allgather_base", "all_gather_into_tensor_coalesced",
# "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "alltoall_base", ...): they are
# canonicalised by dropping leading underscores, the _base/_coalesced/_into_tensor/_tensor
# variants and the remaining underscores, then looked up here. Unknown names are kept lower-cased;
# send/recv carry their ranks ("send 0->1") and are matched separately.
_OP_KEYS: dict[str, str] = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all_to_all", "alltoallv": "all_to_all",
    "barrier": "barrier", "allreducebarrier": "barrier", "gather": "gather", "scatter": "scatter",
    "coalesced": "coalesced",
}
_OP_NOISE = re.compile(r"_(base|coalesced|into_tensor|tensor)(?=_|$)")
_P2P_NAME = re.compile(r"^(send|recv)\s+(\d+)\s*(?:->|<-)\s*(\d+)")

# Stack frames inside these paths are torch's, not the training code's.
_TORCH_FRAME = re.compile(r"[/\\]torch[/\\](distributed|nn[/\\]parallel|_dynamo|utils)[/\\]|^<")


class DumpError(Exception):
    """A dump that cannot be used; ``reason`` is a short counter key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle referenced a global outside the allow-list (e.g. ``os.system``)."""

    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"refused global {module}.{name}")
        self.module, self.name = module, name


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles plain containers only. Every global lookup is refused except set/frozenset.

    Why an allow-list and not a deny-list: any callable reachable by ``find_class`` can be invoked
    by REDUCE/NEWOBJ with attacker-chosen arguments. ``set`` and ``frozenset`` only build
    containers. ``__builtin__`` is the Python 2 spelling that protocol-2 pickles use (the default
    ``fix_imports`` mapping lives in the base ``find_class``, which we do not call).
    """

    _ALLOWED = frozenset({("builtins", "set"), ("builtins", "frozenset"),
                          ("__builtin__", "set"), ("__builtin__", "frozenset")})

    def find_class(self, module: str, name: str) -> type:
        if (module, name) in self._ALLOWED:
            return builtins.set if name == "set" else builtins.frozenset
        raise RefusedGlobal(module, name)

    def persistent_load(self, pid: object) -> NoReturn:
        raise pickle.UnpicklingError("persistent ids are refused")


def load_dump_bytes(data: bytes) -> dict[str, object]:
    """Unpickle a dump with :class:`RestrictedUnpickler`; raises :class:`DumpError`.

    Reasons: ``too_large``, ``refused_global`` (a malicious or foreign pickle: never retried),
    ``truncated`` (no STOP opcode yet: torch writes the file in place, so a dump still being written
    looks like this; retry later), ``malformed``, ``not_a_dict``.
    """
    if len(data) > MAX_DUMP_BYTES:
        raise DumpError("too_large", f"{len(data)} bytes")
    if not data:
        raise DumpError("truncated", "empty file")
    try:
        obj = RestrictedUnpickler(io.BytesIO(data)).load()
    except RefusedGlobal as exc:
        raise DumpError("refused_global", f"{exc.module}.{exc.name}") from None
    except EOFError:
        raise DumpError("truncated", "end of data before STOP") from None
    except (pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            MemoryError, RecursionError, UnicodeDecodeError, OverflowError) as exc:
        # A partial write usually ends mid-opcode: the unpickler reports it as one of these.
        text = str(exc)
        reason = "truncated" if "truncated" in text or "ran out" in text else "malformed"
        raise DumpError(reason, f"{type(exc).__name__}: {text[:200]}") from None
    if not isinstance(obj, dict):
        raise DumpError("not_a_dict", type(obj).__name__)
    return obj


# ---------------------------------------------------------------------------------- parsing


@dataclass
class PgInfo:
    name: str
    desc: str | None
    ranks: list[int] | None  # global ranks; None when the dump does not list them


@dataclass
class FrEntry:
    """One ring entry: the record perfd emits plus what only hang detection needs."""

    record: CollectiveRecord
    retired: bool
    record_id: int | None
    timeout_ms: int | None
    user_frame: str | None  # "train.py:123 in step": first stack frame outside torch

    @property
    def active(self) -> bool:
        """Enqueued and not yet seen to finish (candidate for a hang)."""
        return not self.retired and self.record.state in ("scheduled", "started")


@dataclass
class FlightRecorderDump:
    rank: int
    version: str | None
    pg_config: dict[str, PgInfo]
    pg_status: dict[str, dict[str, int]]  # pg uid (str) -> last_{enqueued,started,completed}_collective
    entries: list[FrEntry]
    comm_lib_version: str | None = None
    issues: dict[str, int] = field(default_factory=dict)  # reason -> count, never fatal
    path: str | None = None
    notes: dict[str, int] = field(default_factory=dict)  # what was read differently, not a problem
    only_active: bool = False  # every entry in flight (TORCH_INCLUDE_ONLY_ACTIVE=1), before batches fold

    def last_seq(self, pg_name: str, p2p: bool = False) -> int | None:
        """Highest sequence number this rank enqueued on a group (entries, or pg_status)."""
        best: int | None = None
        uid: int | None = None
        for e in self.entries:
            r = e.record
            if r.pg_name != pg_name or r.is_p2p != p2p:
                continue
            uid = r.pg_id
            seq = r.p2p_seq_id if p2p else r.collective_seq_id
            if seq is not None and (best is None or seq > best):
                best = seq
        if not p2p and uid is not None:
            # pg_status is exact even when the ring has wrapped past this group's entries.
            st = self.pg_status.get(str(uid), {})
            enq = st.get("last_enqueued_collective")
            if isinstance(enq, int) and enq >= 0 and (best is None or enq > best):
                best = enq
        return best


def _count(issues: dict[str, int], key: str) -> None:
    issues[key] = issues.get(key, 0) + 1


def _opt_int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def parse_ranks(text: object) -> list[int] | None:
    """``"[0, 1, 2]"`` (how pg_config prints them) or a list -> ints; anything else -> None."""
    if isinstance(text, list | tuple):
        vals = list(text)
    elif isinstance(text, str):
        body = text.strip().strip("[]() ")
        if not body:
            return None
        vals = [v.strip() for v in body.split(",") if v.strip()]
    else:
        return None
    try:
        out = [int(v) for v in vals]
    except (TypeError, ValueError):
        return None
    return out or None


def canonical_op(name: str) -> tuple[str, int | None, int | None]:
    """``"nccl:all_reduce"`` -> ("all_reduce", None, None); ``"nccl:send 0->1"`` -> ("send", 0, 1)."""
    base = name.split(":", 1)[1] if ":" in name else name
    base = base.strip()
    m = _P2P_NAME.match(base)
    if m:
        return m.group(1), int(m.group(2)), int(m.group(3))
    raw = base.split()[0].lower() if base else ""
    key = _OP_NOISE.sub("", raw.lstrip("_")).replace("_", "")
    return _OP_KEYS.get(key, raw or "unknown"), None, None


def tensor_bytes(sizes: object, dtypes: object, issues: dict[str, int]) -> int | None:
    """Sum over tensors of prod(shape) * element size; None if a dtype or shape is unusable."""
    if not isinstance(sizes, list) or not isinstance(dtypes, list):
        return None
    if len(sizes) != len(dtypes):
        _count(issues, "sizes_dtypes_mismatch")
        return None
    total = 0
    for shape, dt in zip(sizes, dtypes, strict=True):
        width = DTYPE_BYTES.get(dt) if isinstance(dt, str) else None
        if width is None:
            _count(issues, "unknown_dtype")
            return None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            _count(issues, "bad_shape")
            return None
        n = 1
        for d in shape:
            n *= d
        total += n * width
    return total


def _dtype_of(entry: Mapping[str, object]) -> str | None:
    given = entry.get("input_dtypes") or entry.get("output_dtypes") or []
    names = [d for d in given if isinstance(d, str)] if isinstance(given, list | tuple) else []
    uniq = sorted(set(names))
    return uniq[0] if len(uniq) == 1 else ("mixed:" + ",".join(uniq) if uniq else None)


def _user_frame(frames: object) -> str | None:
    if not isinstance(frames, list):
        return None
    for fr in frames:
        if not isinstance(fr, dict):
            continue
        fname = fr.get("filename")
        if isinstance(fname, str) and not _TORCH_FRAME.search(fname):
            return f"{fname}:{fr.get('line')} in {fr.get('name')}"
    return None


def parse_dump(raw: Mapping[str, object], rank: int, job: str, path: str | None = None) -> FlightRecorderDump:
    """Turn an unpickled dump into typed entries. Bad entries are counted in ``issues``, skipped."""
    issues: dict[str, int] = {}
    version = raw.get("version")
    pg_config: dict[str, PgInfo] = {}
    cfg = raw.get("pg_config")
    if isinstance(cfg, dict):
        for key, val in cfg.items():
            if not isinstance(val, dict):
                _count(issues, "bad_pg_config")
                continue
            name = str(val.get("name", key))
            desc = val.get("desc")
            ranks = parse_ranks(val.get("ranks"))
            pg_config[name] = PgInfo(name, desc if isinstance(desc, str) else None, ranks)
    pg_status: dict[str, dict[str, int]] = {}
    st = raw.get("pg_status")
    if isinstance(st, dict):
        for key, val in st.items():
            if isinstance(val, dict):
                pg_status[str(key)] = {str(k): v for k, v in val.items() if _opt_int(v) is not None}
    entries: list[FrEntry] = []
    raw_entries = raw.get("entries")
    if not isinstance(raw_entries, list):
        _count(issues, "no_entries_list")
        raw_entries = []
    prov = Provenance("nccl", f"flight_recorder:{path or f'rank{rank}'}")
    for e in raw_entries:
        if not isinstance(e, dict):
            _count(issues, "entry_not_a_dict")
            continue
        fe = _parse_entry(e, rank, job, pg_config, issues, prov)
        if fe is not None:
            entries.append(fe)
    notes: dict[str, int] = {}
    only_active = bool(entries) and all(fe.record.state != "completed" for fe in entries)
    entries = merge_batches(entries, issues, notes)
    lib = raw.get("comm_lib_version")
    return FlightRecorderDump(rank=rank, version=str(version) if version is not None else None,
                              pg_config=pg_config, pg_status=pg_status, entries=entries,
                              comm_lib_version=lib if isinstance(lib, str) and lib else None,
                              issues=issues, path=path, notes=notes, only_active=only_active)


def _parse_entry(e: Mapping[str, object], rank: int, job: str, pg_config: Mapping[str, PgInfo],
                 issues: dict[str, int], prov: Provenance) -> FrEntry | None:
    pg_id = _opt_int(e.get("pg_id"))
    name = e.get("profiling_name")
    if pg_id is None or not isinstance(name, str):
        _count(issues, "entry_missing_pg_or_name")
        return None
    pg = e.get("process_group")
    pg_name = str(pg[0]) if isinstance(pg, tuple | list) and len(pg) >= 1 else str(pg_id)
    pg_desc = str(pg[1]) if isinstance(pg, tuple | list) and len(pg) >= 2 else None
    info = pg_config.get(pg_name)
    ranks = info.ranks if info else None
    op, src, dst = canonical_op(name)
    is_p2p = bool(e.get("is_p2p", False)) or op in ("send", "recv")
    in_b = tensor_bytes(e.get("input_sizes"), e.get("input_dtypes"), issues)
    out_b = tensor_bytes(e.get("output_sizes"), e.get("output_dtypes"), issues)
    sizes = [b for b in (in_b, out_b) if b is not None]
    nbytes = max(sizes) if sizes else None
    dur = e.get("duration_ms")  # absent unless TORCH_NCCL_ENABLE_TIMING=1: stays None, never 0
    duration = float(dur) if isinstance(dur, int | float) and not isinstance(dur, bool) else None
    group_rank = ranks.index(rank) if ranks and rank in ranks else None
    peer = None
    if is_p2p and src is not None and dst is not None:
        # "send a->b": a is this rank, b the peer; "recv a<-b": a is this rank, b the peer.
        peer = dst
    state = e.get("state")
    rec = CollectiveRecord(
        job=job, source="flight_recorder", op=op, rank=rank, raw_op=name, pg_id=pg_id,
        pg_name=pg_name, pg_desc=pg_desc, pg_ranks=list(ranks) if ranks else None,
        group_rank=group_rank, group_size=len(ranks) if ranks else None,
        collective_seq_id=_opt_int(e.get("collective_seq_id")), p2p_seq_id=_opt_int(e.get("p2p_seq_id")),
        is_p2p=is_p2p, peer=peer, bytes=nbytes, dtype=_dtype_of(e),
        state=state if isinstance(state, str) else None,
        time_created_ns=_opt_int(e.get("time_created_ns")),
        time_completed_ns=_opt_int(e.get("time_discovered_completed_ns")),
        duration_ms=duration, provenance=prov,
    )
    if duration is not None and duration > 0 and nbytes and rec.group_size:
        # duration_ms includes waiting for peers: this is a lower bound of the link's bandwidth.
        rec.algbw_gbs = nbytes / (duration * 1e-3) / 1e9
        factor = bus_bw_factor(op, rec.group_size)
        rec.busbw_gbs = rec.algbw_gbs * factor if factor is not None else None
    return FrEntry(record=rec, retired=bool(e.get("retired", False)), record_id=_opt_int(e.get("record_id")),
                   timeout_ms=_opt_int(e.get("timeout_ms")), user_frame=_user_frame(e.get("frames")))


# ---------------------------------------------------------------------------------- batches

# Ops issued inside a coalescing group (torch.distributed.batch_isend_irecv, which Megatron-LM's
# pipeline p2p uses; the coalescing manager) are recorded by ProcessGroupNCCL as one entry per op
# WITHOUT CUDA events — they never leave "scheduled", never retire, never get a duration — followed
# by one "nccl:coalesced" entry that carries the events, state and duration of the whole batch. All
# of them share the batch's sequence number. Read one by one, the first member stood for the batch
# (its siblings counted as duplicates), never completed, and looked like a hang; so a batch is
# folded into one entry: the coalesced entry's state and timing, the members' ops, peers and bytes.

_BATCH_HEAD = "coalesced"
_P2P_OPS = frozenset({"send", "recv"})


def _seq_key(r: CollectiveRecord) -> tuple[int, bool, int] | None:
    seq = r.p2p_seq_id if r.is_p2p else r.collective_seq_id
    return (r.pg_id, r.is_p2p, seq) if r.pg_id is not None and seq is not None else None


def _batch_entry(head: FrEntry, members: list[FrEntry]) -> FrEntry:
    """One entry for a batch: timing and state from ``head`` (the coalesced entry), the rest from the ops."""
    h = head.record
    ops = sorted({m.record.op for m in members})
    if set(ops) <= _P2P_OPS:
        op = ops[0] if len(ops) == 1 else "send_recv"
    else:
        op = ops[0] if len(ops) == 1 else _BATCH_HEAD
    peers = {m.record.peer for m in members}
    sizes = [m.record.bytes for m in members]
    dtypes = {m.record.dtype for m in members}
    nbytes = sum(b for b in sizes if b is not None) if all(b is not None for b in sizes) else None
    first = members[0].record
    rec = CollectiveRecord(
        job=h.job, source=h.source, op=op, rank=h.rank,
        raw_op=f"{h.raw_op}[{', '.join(m.record.raw_op or m.record.op for m in members)}]",
        pg_id=h.pg_id, pg_name=h.pg_name, pg_desc=h.pg_desc, pg_ranks=h.pg_ranks, group_rank=h.group_rank,
        group_size=h.group_size, collective_seq_id=first.collective_seq_id, p2p_seq_id=first.p2p_seq_id,
        is_p2p=first.is_p2p, peer=peers.pop() if len(peers) == 1 else None, bytes=nbytes,
        dtype=dtypes.pop() if len(dtypes) == 1 else None, state=h.state,
        time_created_ns=first.time_created_ns,
        time_completed_ns=h.time_completed_ns, duration_ms=h.duration_ms, provenance=h.provenance,
    )
    if rec.duration_ms is not None and rec.duration_ms > 0 and nbytes and rec.group_size:
        rec.algbw_gbs = nbytes / (rec.duration_ms * 1e-3) / 1e9
        factor = bus_bw_factor(op, rec.group_size)
        rec.busbw_gbs = rec.algbw_gbs * factor if factor is not None else None
    frame = next((m.user_frame for m in members if m.user_frame), head.user_frame)
    return FrEntry(record=rec, retired=head.retired, record_id=head.record_id, timeout_ms=head.timeout_ms,
                   user_frame=frame)


def merge_batches(entries: list[FrEntry], issues: dict[str, int], notes: dict[str, int]) -> list[FrEntry]:
    """Fold each coalesced batch into one entry (see above); ring order kept, at the head's place.

    A head is matched to the event-less entries just before it (op ids consecutive in the ring)
    that share its process group and its sequence number: the p2p one for a p2p batch (torch 2.11
    records the head itself as a collective, with the collective counter of the moment), the
    collective one for a coalesced collective. Left alone or dropped, by what the dump can prove:
      - a head whose members left the ring: its batch was read from an earlier dump (noted);
      - several members without their head: in a dump of only in-flight work (no completed entry
        at all, TORCH_INCLUDE_ONLY_ACTIVE=1) the head completed and was left out, and so did the
        batch (noted); otherwise the batch was being recorded when the dump was taken: left for a
        later dump (counted as an issue). A lone member without its head stays: a p2p op in flight
        looks the same (so an only-active dump of a pipeline job can still show single p2p ops
        that finished long ago as in flight; perfd launch turns only-active off).
    """
    def eventless(fe: FrEntry) -> bool:
        return not fe.retired and fe.record.state == "scheduled" and fe.record.op != _BATCH_HEAD

    only_active = bool(entries) and all(fe.record.state != "completed" for fe in entries)
    merged: dict[int, FrEntry] = {}
    drop: set[int] = set()
    i = 0
    while i < len(entries):
        fe = entries[i]
        r = fe.record
        if not eventless(fe) or r.pg_id is None:
            i += 1
            continue
        seq = r.p2p_seq_id if r.is_p2p else r.collective_seq_id
        j = i  # the run of event-less entries of one group and one sequence number
        while (j + 1 < len(entries) and eventless(entries[j + 1]) and entries[j + 1].record.pg_id == r.pg_id
               and entries[j + 1].record.is_p2p == r.is_p2p
               and (entries[j + 1].record.p2p_seq_id if r.is_p2p else entries[j + 1].record.collective_seq_id)
               == seq):
            j += 1
        members = list(range(i, j + 1))
        head = j + 1 if j + 1 < len(entries) else None
        if head is not None:
            h = entries[head].record
            h_seq = h.p2p_seq_id if r.is_p2p else h.collective_seq_id
            if not (h.op == _BATCH_HEAD and h.pg_id == r.pg_id and h_seq == seq):
                head = None
        if head is not None:
            merged[head] = _batch_entry(entries[head], [entries[k] for k in members])
            drop.update(members)
            _count(notes, "batches_merged")
            i = head + 1
            continue
        if len(members) > 1:
            drop.update(members)
            _count(notes if only_active else issues,
                   "batch_members_only_active" if only_active else "batch_head_missing")
        i = j + 1
    for k, fe in enumerate(entries):
        if fe.record.op == _BATCH_HEAD and k not in merged:
            drop.add(k)
            _count(notes, "batch_head_without_members")
    if not merged and not drop:
        return entries
    return [merged.get(k, fe) for k, fe in enumerate(entries) if k not in drop]


# ---------------------------------------------------------------------------------- dedupe

_Key = tuple[int, bool, int]  # (pg_id, is_p2p, seq)


@dataclass
class _Pending:
    entry: FrEntry
    completed_sightings: int = 0


@dataclass
class _RankState:
    emitted: dict[tuple[int, bool], set[int]] = field(default_factory=dict)
    max_seq: dict[tuple[int, bool], int] = field(default_factory=dict)
    pending: dict[_Key, _Pending] = field(default_factory=dict)


class FlightRecorderTracker:
    """Turns successive dumps of each rank into each operation exactly once, when it is final.

    Dedupe key: (pg_id, collective_seq_id) for collectives, (pg_id, p2p_seq_id) for p2p, per rank.
    An entry is final when the watchdog retired it, or when it is ``completed`` with its duration,
    or when it was ``completed`` in two successive dumps (timing off: no duration will come).
    Until then it is held and a later dump updates its state (scheduled -> started -> completed).
    A rank whose sequence numbers go backwards restarted: its state is reset.
    """

    def __init__(self, job: str, keep_per_group: int = 20_000) -> None:
        self.job = job
        self.keep = keep_per_group
        self.latest: dict[int, FlightRecorderDump] = {}
        self.counts: dict[str, int] = {}
        self._ranks: dict[int, _RankState] = {}
        self.progress = 0  # sequence numbers advanced over all ranks and groups (the dump pacing reads it)

    def _c(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def update(self, dump: FlightRecorderDump) -> list[CollectiveRecord]:
        """Records that became final with this dump (in dump order)."""
        st = self._ranks.setdefault(dump.rank, _RankState())
        if self._restarted(st, dump):
            self._c("rank_restarted")
            st = self._ranks[dump.rank] = _RankState()
        self.latest[dump.rank] = dump
        for note, n in dump.notes.items():
            self._c(note, n)
        out: list[CollectiveRecord] = []
        seen_now: set[_Key] = set()
        min_seq: dict[tuple[int, bool], int] = {}
        for fe in dump.entries:
            r = fe.record
            seq = r.p2p_seq_id if r.is_p2p else r.collective_seq_id
            if r.pg_id is None or seq is None:
                self._c("entry_without_seq")
                continue
            grp = (r.pg_id, r.is_p2p)
            key = (r.pg_id, r.is_p2p, seq)
            if key in seen_now:
                self._c("duplicate_seq_in_dump")  # (pg, seq) is unique per work in torch; count if not
                continue
            seen_now.add(key)
            min_seq[grp] = min(min_seq.get(grp, seq), seq)
            if seq in st.emitted.get(grp, ()):
                continue
            pend = st.pending.get(key)
            if pend is None:
                pend = st.pending[key] = _Pending(fe)
            else:
                if pend.entry.record.state != r.state:
                    self._c("state_updates")
                pend.entry = fe
            if r.state == "completed" and not fe.retired:
                pend.completed_sightings += 1
            if fe.retired or (r.state == "completed" and (r.duration_ms is not None
                                                           or pend.completed_sightings >= 2)):
                out.append(r)
                del st.pending[key]
                st.emitted.setdefault(grp, set()).add(seq)
        # A dump with entries, none of them completed, is an only-active dump
        # (TORCH_INCLUDE_ONLY_ACTIVE=1, Megatron-LM's default): its sequence gaps are completed
        # collectives the dump left out, not a wrapped ring. Said by name, not counted as lost.
        only_active = dump.only_active
        if only_active:
            self._c("only_active_dump")
        for grp, lo in min_seq.items():
            prev = st.max_seq.get(grp)
            if prev is not None and lo > prev + 1:
                if only_active:
                    self._c("entries_left_out_by_only_active", lo - prev - 1)
                else:
                    self._c("entries_lost_between_dumps", lo - prev - 1)  # the ring wrapped: dump more often
        for grp in min_seq:
            hi = max(k[2] for k in seen_now if (k[0], k[1]) == grp)
            self.progress += max(0, hi - st.max_seq.get(grp, hi))
            st.max_seq[grp] = max(st.max_seq.get(grp, hi), hi)
        # Held entries that left the ring without becoming final: report what we know, once.
        for key in [k for k in st.pending if k not in seen_now]:
            pend = st.pending.pop(key)
            self._c("pending_left_ring")
            st.emitted.setdefault((key[0], key[1]), set()).add(key[2])
            out.append(pend.entry.record)
        self._prune(st)
        self._c("records", len(out))
        return out

    def flush(self) -> list[CollectiveRecord]:
        """Completed entries still held (end of the job): emit them as they are."""
        out: list[CollectiveRecord] = []
        for st in self._ranks.values():
            for key, pend in list(st.pending.items()):
                if pend.entry.record.state == "completed":
                    out.append(pend.entry.record)
                    st.emitted.setdefault((key[0], key[1]), set()).add(key[2])
                    del st.pending[key]
        return out

    def _restarted(self, st: _RankState, dump: FlightRecorderDump) -> bool:
        # Sequence numbers only grow within a process, and the ring evicts oldest first: a group's
        # newest entry can never be older than the newest seen before, unless the process is new.
        maxima: dict[tuple[int, bool], int] = {}
        for fe in dump.entries:
            r = fe.record
            seq = r.p2p_seq_id if r.is_p2p else r.collective_seq_id
            if r.pg_id is not None and seq is not None:
                g = (r.pg_id, r.is_p2p)
                maxima[g] = max(maxima.get(g, seq), seq)
        return any(g in st.max_seq and hi < st.max_seq[g] for g, hi in maxima.items())

    def _prune(self, st: _RankState) -> None:
        for grp, seqs in st.emitted.items():
            if len(seqs) > self.keep:
                floor = st.max_seq.get(grp, 0) - self.keep
                st.emitted[grp] = {s for s in seqs if s > floor}
