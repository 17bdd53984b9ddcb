"""A :class:`perfd.core.collfold.CollectivePartial` on the wire (perfd.proto's
``CollectivePartial``): columns, strings and process groups listed once, a nullable column only where
set, enqueue times as differences, float32 durations where exact. What a row costs there is measured
in tests/engine/test_collective_wire.py against the ``CollectiveRecord`` it reduces."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TypeVar

from perfd.core.collfold import CollectivePartial, GroupRef, OpKey, OpRow, op_key
from perfd.transport.gen import perfd_pb2 as pb

# The nullable columns, each a bit of a row's ``unset`` mask (the wire's order: never reorder).
NULLABLE = ("rank", "pg_id", "group_rank", "group_size", "nnodes", "collective_seq_id", "peer", "bytes",
            "time_created_ns", "pid", "duration_ms", "busbw_gbs", "p2p_seq_id")
_BIT = {name: 1 << i for i, name in enumerate(NULLABLE)}
DURATION_F64 = 1 << len(NULLABLE)  # the row's duration is in duration_ms, not duration_ms_f32
_INTS = ("rank", "pg_id", "group_rank", "group_size", "nnodes", "collective_seq_id", "p2p_seq_id", "peer",
         "bytes", "pid")
_F32 = struct.Struct("<f")
_V = TypeVar("_V", int, float)


def _is_f32(x: float) -> bool:
    try:
        return bool(_F32.unpack(_F32.pack(x))[0] == x)
    except OverflowError:
        return False


class _Strings:
    def __init__(self, m: pb.CollectivePartial) -> None:
        self.m, self.index = m, dict[str, int]()

    def __call__(self, s: str | None) -> int:
        if s is None:
            return 0
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.m.strings) + 1
            self.m.strings.append(s)
        return i


def to_pb(p: CollectivePartial, m: pb.CollectivePartial) -> None:
    m.job = p.job
    string = _Strings(m)
    groups: dict[GroupRef, int] = {}
    ints: dict[str, list[int]] = {c: [] for c in _INTS}
    durs64: list[float] = []
    durs32: list[float] = []
    busbw: list[float] = []
    deltas: list[int] = []
    prev_t = 0
    for _key, row in p.ordered():
        g = groups.get(row.group)
        if g is None:
            g = groups[row.group] = len(m.groups)
            ranks = row.group.pg_ranks
            m.groups.add(pg_name=string(row.group.pg_name), comm_id=string(row.group.comm_id),
                         pg_desc=string(row.group.pg_desc), has_ranks=ranks is not None,
                         ranks_runs=runs_of(ranks or ()))
        m.source.append(string(row.source))
        m.op.append(string(row.op))
        m.group.append(g)
        m.state.append(string(row.state))
        m.host.append(string(row.host))
        m.is_p2p.append(row.is_p2p)
        unset = 0
        for name in _INTS:
            v = getattr(row, name)
            if v is None:
                unset |= _BIT[name]
            else:
                ints[name].append(v)
        if row.time_created_ns is None:
            unset |= _BIT["time_created_ns"]
        else:
            deltas.append(row.time_created_ns - prev_t)
            prev_t = row.time_created_ns
        if row.duration_ms is None:
            unset |= _BIT["duration_ms"]
        elif _is_f32(row.duration_ms):
            durs32.append(row.duration_ms)
        else:
            durs64.append(row.duration_ms)
            unset |= DURATION_F64
        if row.busbw_gbs is None:
            unset |= _BIT["busbw_gbs"]
        else:
            busbw.append(row.busbw_gbs)
        m.unset.append(unset)
    progress = p.progress
    for key in sorted(progress.enqueued.keys() | progress.completed.keys()):
        rank, group, p2p = key
        m.progress_rank.append(rank)
        m.progress_group.append(string(group))
        m.progress_p2p.append(p2p)
        m.progress_enqueued.append(progress.enqueued.get(key, -1))
        m.progress_completed.append(progress.completed.get(key, -1))
    for name, vals in ints.items():
        getattr(m, name).extend(vals)
    m.time_created_delta_ns.extend(deltas)
    m.duration_ms.extend(durs64)
    m.duration_ms_f32.extend(durs32)
    m.busbw_gbs.extend(busbw)


def runs_of(ranks: Sequence[int]) -> list[int]:
    """``ranks`` as runs (first, step, count), flattened; the longest run from each start."""
    n = len(ranks)
    if n > 2 and (step := ranks[1] - ranks[0]):
        first = ranks[0]
        if tuple(ranks) == tuple(range(first, first + step * n, step)):
            return [first, step, n]  # one run (a world or data-parallel group): compared in C, not walked
    out: list[int] = []
    i = 0
    while i < n:
        step = ranks[i + 1] - ranks[i] if i + 1 < n else 1
        j = i + 1
        while j < n and ranks[j] - ranks[j - 1] == step:
            j += 1
        out += (ranks[i], step, j - i)
        i = j
    return out


def ranks_of_runs(runs: Sequence[int]) -> tuple[int, ...]:
    if len(runs) % 3 or any(c <= 0 for c in runs[2::3]):
        raise ValueError("ranks_runs is not whole (first, step, count) runs")
    if sum(runs[2::3]) > MAX_GROUP_RANKS:
        raise ValueError(f"a group of over {MAX_GROUP_RANKS} ranks")
    out: list[int] = []
    for first, step, count in zip(runs[0::3], runs[1::3], runs[2::3], strict=True):
        out.extend(range(first, first + step * count, step) if step else [first] * count)
    return tuple(out)


# A group is read once and its one object shared by every message that names it: the root's merge and
# the analysis tell a group apart by identity, not by comparing its ranks (100,000 for a world group),
# and a shard's fold looks each row's group up by it (a new equal object compares field by field).
# Keyed by its strings (not their indices: each message lists its own) and its runs. A group of
# BIG_GROUP_RANKS or more is kept apart from the others, so that a root naming more small groups than
# SMALL_GROUPS_KEPT (a 100,000-rank job has 12,500 tensor-parallel groups of 8) lets those go, not
# its world and data-parallel groups; either cache is let go whole when full.
BIG_GROUP_RANKS = 256
BIG_GROUPS_KEPT = 1024
SMALL_GROUPS_KEPT = 8192
MAX_GROUP_RANKS = 1 << 22  # a group listing more ranks is not one (the engine is for 100,000)
GroupKey = tuple[str | None, str | None, str | None, bool, tuple[int, ...]]
_big_groups: dict[GroupKey, GroupRef] = {}
_small_groups: dict[GroupKey, GroupRef] = {}


def _group(g: pb.CollectiveGroup, s: Callable[[int], str | None]) -> GroupRef:
    runs = tuple(g.ranks_runs)
    key = (s(g.pg_name), s(g.comm_id), s(g.pg_desc), g.has_ranks, runs)
    hit = _small_groups.get(key) or _big_groups.get(key)
    if hit is not None:
        return hit
    ref = GroupRef(key[0], key[1], key[2], ranks_of_runs(runs) if g.has_ranks else None)
    kept = _big_groups if len(ref.pg_ranks or ()) >= BIG_GROUP_RANKS else _small_groups
    if len(kept) >= (BIG_GROUPS_KEPT if kept is _big_groups else SMALL_GROUPS_KEPT):
        kept.clear()
    kept[key] = ref
    return ref


def _nullable(name: str, values: Sequence[_V], unset: Sequence[int], any_unset: int,
              bit: str | None = None) -> Sequence[_V | None]:
    """A nullable column, one entry a row (None where its row's mask has the column's ``bit``)."""
    return _expand(name, list(values), unset, any_unset, _BIT[bit or name])


def _expand(name: str, vals: list[_V], unset: Sequence[int], any_unset: int, bit: int) -> Sequence[_V | None]:
    if not any_unset & bit:  # set on every row (the usual: Flight Recorder's rows have every field)
        if len(vals) != len(unset):
            raise ValueError(f"column {name} has {len(vals)} values for {len(unset)} rows")
        return vals  # (a list of its own: the caller's)
    if sum(1 for u in unset if not u & bit) != len(vals):
        raise ValueError(f"column {name} has {len(vals)} values, not the count its rows' masks say")
    it = iter(vals)
    return [None if u & bit else next(it) for u in unset]


def _strings(col: Sequence[int], strings: list[str | None], what: str) -> list[str | None]:
    try:
        return [strings[i] for i in col]
    except IndexError:
        raise ValueError(f"a {what} string index past the {len(strings) - 1} listed") from None


def from_pb(m: pb.CollectivePartial) -> CollectivePartial:
    """ValueError for a malformed partial (the caller counts and drops it).

    Column by column, then zipped into rows (a tuple each: OpRow): a shard decodes every operation
    of its nodes' ranks (150,000 an iteration at 100,000 ranks and 4 shards), and reading row by row
    through per-column iterators and a dict a row was over a third of its fold (shard_fold_bench
    --profile)."""
    n = len(m.source)
    if any(len(c) != n for c in (m.op, m.group, m.state, m.host, m.unset, m.is_p2p)):
        raise ValueError("a collective partial's row columns differ in length")
    strings: list[str | None] = [None, *m.strings]

    def s(i: int) -> str | None:
        if i >= len(strings):
            raise ValueError(f"string index {i} past the {len(m.strings)} listed")
        return strings[i]

    groups = [_group(g, s) for g in m.groups]
    source, op = _strings(m.source, strings, "source"), _strings(m.op, strings, "op")
    if any(v is None for v in source) or any(v is None for v in op):
        raise ValueError("a collective partial's row without its source or op")
    try:
        group = [groups[i] for i in m.group]
    except IndexError:
        raise ValueError(f"a group index past the {len(groups)} listed") from None
    unset = list(m.unset)
    any_unset = 0
    for u in set(unset):
        any_unset |= u
    # (Sequence, not list[object](...): calling the generic alias costs ~0.3 us a column, 19 a message)
    is_p2p = list(m.is_p2p)
    col: dict[str, Sequence[object]] = {
        "source": source, "op": op, "group": group, "is_p2p": is_p2p,
        "state": _strings(m.state, strings, "state"), "host": _strings(m.host, strings, "host")}
    for c in _INTS:
        col[c] = _nullable(c, getattr(m, c), unset, any_unset)
    col["time_created_ns"] = _created(m, unset, any_unset)
    col["duration_ms"] = _durations(m, unset, any_unset)
    col["busbw_gbs"] = _nullable("busbw_gbs", m.busbw_gbs, unset, any_unset)
    out = CollectivePartial(m.job)
    make = tuple.__new__  # a row straight from its columns (OpRow's own __new__ takes them one by one)
    rows: list[OpRow] = [make(OpRow, vals) for vals in zip(*(col[f] for f in OpRow._fields), strict=True)]
    if not any_unset & (_BIT["rank"] | _BIT["pg_id"]):
        # Every row a rank's (Flight Recorder's): each key (op_key's) made from the columns, and the
        # rows put in their ranks' streams at once where no key comes twice (an agent's partial holds
        # each operation once). A key and a merge a row (out.add) were a third of a shard's decode
        # (py-spy on perfd bench engine --collectives).
        ranks, pgs = col["rank"], col["pg_id"]
        seqs = [p if x else c for c, p, x in zip(col["collective_seq_id"], col["p2p_seq_id"], is_p2p,
                                                  strict=True)]
        keys: list[OpKey] = list(zip(source, ranks, pgs, seqs, is_p2p, strict=True))
        if len(set(keys)) == n:
            streams = out.streams
            for key, row in zip(keys, rows, strict=True):
                held = streams.get(key[:2])
                if held is None:
                    held = streams[key[:2]] = {}
                held[key] = row
            _read_progress(m, strings, out)
            return out
    for row in rows:
        out.add(op_key(row), row)
    _read_progress(m, strings, out)
    return out


def _created(m: pb.CollectivePartial, unset: Sequence[int], any_unset: int) -> list[int | None]:
    """Enqueue times from their differences (each from the previous set one, the first from 0)."""
    deltas = _nullable("time_created_delta_ns", m.time_created_delta_ns, unset, any_unset,
                       "time_created_ns")
    t = 0
    out: list[int | None] = []
    for d in deltas:
        if d is None:
            out.append(None)
        else:
            t += d
            out.append(t)
    return out


def _durations(m: pb.CollectivePartial, unset: Sequence[int], any_unset: int) -> Sequence[float | None]:
    """Each set duration from the float32 column, or the float64 one where its row's mask says."""
    bit = _BIT["duration_ms"]
    d32, d64 = list(m.duration_ms_f32), list(m.duration_ms)
    if not any_unset & (bit | DURATION_F64):
        if d64:
            raise ValueError("column duration_ms has values no row's mask names")
        return _expand("duration_ms_f32", d32, unset, any_unset, bit)
    wide = [0 if u & bit else (2 if u & DURATION_F64 else 1) for u in unset]  # 0: unset, 1: f32, 2: f64
    if wide.count(1) != len(d32) or wide.count(2) != len(d64):
        raise ValueError("a collective partial's duration columns differ from their rows' masks")
    i32, i64 = iter(d32), iter(d64)
    return [None if w == 0 else next(i32) if w == 1 else next(i64) for w in wide]


def _read_progress(m: pb.CollectivePartial, strings: list[str | None], out: CollectivePartial) -> None:
    cols = (m.progress_rank, m.progress_group, m.progress_p2p, m.progress_enqueued, m.progress_completed)
    if any(len(c) != len(m.progress_rank) for c in cols):
        raise ValueError("a collective partial's progress columns differ in length")
    listed = _strings(m.progress_group, strings, "progress group")
    names = [g for g in listed if g is not None]
    if len(names) != len(listed):
        raise ValueError("a collective partial's progress entry without its group")
    keys = list(zip(m.progress_rank, names, m.progress_p2p, strict=True))
    if len(set(keys)) == len(keys):  # each (rank, group, p2p) once: what an agent sends
        for held, seqs in ((out.progress.enqueued, m.progress_enqueued),
                           (out.progress.completed, m.progress_completed)):
            held.update((k, q) for k, q in zip(keys, seqs, strict=True) if q > -1)
        return
    for key, enq, done in zip(keys, m.progress_enqueued, m.progress_completed, strict=True):
        for held, seq in ((out.progress.enqueued, enq), (out.progress.completed, done)):
            if seq > held.get(key, -1):
                held[key] = seq
