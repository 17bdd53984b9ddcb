"""A :class:`perfd.collfold.CollectivePartial` on the wire (perfd.proto's
``CollectivePartial``): columns, strings and process groups listed once, a nullable column only where
set, enqueue times as differences, float32 durations where exact. What a row costs there is measured
in tests/engine/test_collective_wire.py against the ``CollectiveRecord`` it reduces."""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence

from perfd.collfold import CollectivePartial, GroupRef, OpRow, op_key
from perfd.transport.gen import perfd_pb2 as pb

# The nullable columns, each a bit of a row's ``unset`` mask (the wire's order: never reorder).
NULLABLE = ("rank", "pg_id", "group_rank", "group_size", "nnodes", "collective_seq_id", "peer", "bytes",
            "time_created_ns", "pid", "duration_ms", "busbw_gbs", "p2p_seq_id")
_BIT = {name: 1 << i for i, name in enumerate(NULLABLE)}
DURATION_F64 = 1 << len(NULLABLE)  # the row's duration is in duration_ms, not duration_ms_f32
_INTS = ("rank", "pg_id", "group_rank", "group_size", "nnodes", "collective_seq_id", "p2p_seq_id", "peer",
         "bytes", "pid")
_F32 = struct.Struct("<f")


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


# A group this large or larger is read once and its one object shared by every message that names it
# (so the root's merge and the analysis tell it apart by identity, not by comparing 100,000 ranks);
# the cache is let go when it holds BIG_GROUPS_KEPT (a job has a world group and a few data-parallel
# groups this large).
BIG_GROUP_RANKS = 256
BIG_GROUPS_KEPT = 1024
MAX_GROUP_RANKS = 1 << 22  # a group listing more ranks is not one (the engine is for 100,000)
_big_groups: dict[tuple[str | None, str | None, str | None, bytes], GroupRef] = {}


def _group(g: pb.CollectiveGroup, s: Callable[[int], str | None]) -> GroupRef:
    runs = g.ranks_runs
    big = g.has_ranks and sum(runs[2::3]) >= BIG_GROUP_RANKS
    key = (s(g.pg_name), s(g.comm_id), s(g.pg_desc), array("q", runs).tobytes()) if big else None
    if key is not None and (hit := _big_groups.get(key)) is not None:
        return hit
    ref = GroupRef(s(g.pg_name), s(g.comm_id), s(g.pg_desc), ranks_of_runs(runs) if g.has_ranks else None)
    if key is not None:
        if len(_big_groups) >= BIG_GROUPS_KEPT:
            _big_groups.clear()
        _big_groups[key] = ref
    return ref


class _Column:
    """A nullable column read in row order: the next set value for each row whose mask has it."""

    def __init__(self, name: str, values: Sequence[float]) -> None:
        self.name, self.it, self.n = name, iter(values), len(values)
        self.used = 0

    def take(self) -> float:
        self.used += 1
        try:
            return next(self.it)
        except StopIteration:
            raise ValueError(f"column {self.name} has fewer values than its rows' masks say") from None


def from_pb(m: pb.CollectivePartial) -> CollectivePartial:
    """ValueError for a malformed partial (the caller counts and drops it)."""
    n = len(m.source)
    if any(len(c) != n for c in (m.op, m.group, m.state, m.host, m.unset, m.is_p2p)):
        raise ValueError("a collective partial's row columns differ in length")
    strings = [None, *m.strings]

    def s(i: int) -> str | None:
        if i >= len(strings):
            raise ValueError(f"string index {i} past the {len(m.strings)} listed")
        return strings[i]

    groups = [_group(g, s) for g in m.groups]
    cols = {c: _Column(c, getattr(m, c)) for c in _INTS}
    times, d64, d32, bw = (_Column(c, getattr(m, c)) for c in ("time_created_delta_ns", "duration_ms",
                                                                 "duration_ms_f32", "busbw_gbs"))
    out = CollectivePartial(m.job)
    t = 0
    for i, unset in enumerate(m.unset):
        source, op = s(m.source[i]), s(m.op[i])
        if source is None or op is None:
            raise ValueError("a collective partial's row without its source or op")
        if m.group[i] >= len(groups):
            raise ValueError(f"group index {m.group[i]} past the {len(groups)} listed")
        iv = {c: None if unset & _BIT[c] else int(col.take()) for c, col in cols.items()}
        created = None
        if not unset & _BIT["time_created_ns"]:
            t += int(times.take())
            created = t
        dur = None if unset & _BIT["duration_ms"] else (d64 if unset & DURATION_F64 else d32).take()
        row = OpRow(source, op, groups[m.group[i]], iv["rank"], iv["pg_id"], iv["group_rank"],
                    iv["group_size"], iv["nnodes"], iv["collective_seq_id"], iv["p2p_seq_id"], m.is_p2p[i],
                    iv["peer"], iv["bytes"], s(m.state[i]), created, dur,
                    None if unset & _BIT["busbw_gbs"] else bw.take(), s(m.host[i]), iv["pid"])
        out.add(op_key(row), row)
    if any(c.used != c.n for c in (*cols.values(), times, d64, d32, bw)):
        raise ValueError("a collective partial's column has more values than its rows' masks say")
    _read_progress(m, s, out)
    return out


def _read_progress(m: pb.CollectivePartial, s: Callable[[int], str | None], out: CollectivePartial) -> None:
    cols = (m.progress_rank, m.progress_group, m.progress_p2p, m.progress_enqueued, m.progress_completed)
    if any(len(c) != len(m.progress_rank) for c in cols):
        raise ValueError("a collective partial's progress columns differ in length")
    for rank, gi, p2p, enq, done in zip(*cols, strict=True):
        group = s(gi)
        if group is None:
            raise ValueError("a collective partial's progress entry without its group")
        key = (rank, group, p2p)
        for held, seq in ((out.progress.enqueued, enq), (out.progress.completed, done)):
            if seq > held.get(key, -1):
                held[key] = seq

