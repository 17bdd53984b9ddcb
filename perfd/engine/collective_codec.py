"""A :class:`perfd.analytics.collectives.partial.CollectivePartial` on the wire (perfd.proto's
``CollectivePartial``): columns of one entry per operation, strings and process groups listed once,
enqueue times as differences from the previous row. What an operation costs there is measured in
tests/engine/test_collective_partial_wire.py (about 20 bytes a timed Flight Recorder row, where the
record it reduces costs a ``CollectiveRecord`` of ~120 bytes)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from perfd.analytics.collectives.partial import CollectivePartial, GroupRef, OpRow, op_key
from perfd.transport.gen import perfd_pb2 as pb

# The nullable columns, each a bit of a row's ``unset`` mask (the order is the wire's: never reorder).
NULLABLE = ("rank", "pg_id", "group_rank", "group_size", "nnodes", "collective_seq_id", "peer", "bytes",
            "time_created_ns", "pid", "duration_ms", "busbw_gbs", "p2p_seq_id")
_BIT = {name: 1 << i for i, name in enumerate(NULLABLE)}
_INT_COLUMNS = ("rank", "pg_id", "group_rank", "group_size", "nnodes", "collective_seq_id", "p2p_seq_id",
                "peer", "bytes", "pid")
_FLOAT_COLUMNS = ("duration_ms", "busbw_gbs")


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
    prev_t = 0
    for _key, row in p.ordered():
        g = groups.get(row.group)
        if g is None:
            g = groups[row.group] = len(m.groups)
            ranks = row.group.pg_ranks
            m.groups.add(pg_name=string(row.group.pg_name), comm_id=string(row.group.comm_id),
                         pg_desc=string(row.group.pg_desc), has_ranks=ranks is not None,
                         ranks_le=array("I", ranks or ()).tobytes())  # little-endian machines, as Partial
        m.source.append(string(row.source))
        m.op.append(string(row.op))
        m.group.append(g)
        m.state.append(string(row.state))
        m.host.append(string(row.host))
        m.is_p2p.append(row.is_p2p)
        unset = 0
        for name in _INT_COLUMNS:
            v = getattr(row, name)
            unset |= _BIT[name] if v is None else 0
            getattr(m, name).append(v or 0)
        for name in _FLOAT_COLUMNS:
            f = getattr(row, name)
            unset |= _BIT[name] if f is None else 0
            getattr(m, name).append(0.0 if f is None else f)
        t = row.time_created_ns
        if t is None:
            unset |= _BIT["time_created_ns"]
            m.time_created_delta_ns.append(0)
        else:
            m.time_created_delta_ns.append(t - prev_t)
            prev_t = t
        m.unset.append(unset)


def from_pb(m: pb.CollectivePartial) -> CollectivePartial:
    """ValueError for a malformed partial (the caller counts and drops it)."""
    n = len(m.source)
    cols: list[Sequence[object]] = [m.op, m.group, m.state, m.host, m.unset, m.is_p2p,
                                    m.time_created_delta_ns, *(getattr(m, c) for c in _INT_COLUMNS),
                                    *(getattr(m, c) for c in _FLOAT_COLUMNS)]
    if any(len(c) != n for c in cols):
        raise ValueError("a collective partial's columns differ in length")
    strings = [None, *m.strings]

    def s(i: int) -> str | None:
        if i >= len(strings):
            raise ValueError(f"string index {i} past the {len(m.strings)} listed")
        return strings[i]

    groups = []
    for g in m.groups:
        if len(g.ranks_le) % 4:
            raise ValueError(f"ranks_le of {len(g.ranks_le)} bytes is not whole uint32s")
        ranks = array("I")
        ranks.frombytes(g.ranks_le)
        groups.append(GroupRef(s(g.pg_name), s(g.comm_id), s(g.pg_desc),
                               tuple(ranks) if g.has_ranks else None))
    ints = {c: list(getattr(m, c)) for c in _INT_COLUMNS}
    floats = {c: list(getattr(m, c)) for c in _FLOAT_COLUMNS}
    out = CollectivePartial(m.job)
    t = 0
    for i in range(n):
        unset = m.unset[i]
        source, op = s(m.source[i]), s(m.op[i])
        if source is None or op is None:
            raise ValueError("a collective partial's row without its source or op")
        if m.group[i] >= len(groups):
            raise ValueError(f"group index {m.group[i]} past the {len(groups)} listed")
        if not unset & _BIT["time_created_ns"]:
            t += m.time_created_delta_ns[i]
        iv = {c: None if unset & _BIT[c] else ints[c][i] for c in _INT_COLUMNS}
        fv = {c: None if unset & _BIT[c] else floats[c][i] for c in _FLOAT_COLUMNS}
        row = OpRow(source, op, groups[m.group[i]], iv["rank"], iv["pg_id"], iv["group_rank"],
                    iv["group_size"], iv["nnodes"], iv["collective_seq_id"], iv["p2p_seq_id"], m.is_p2p[i],
                    iv["peer"], iv["bytes"], s(m.state[i]), None if unset & _BIT["time_created_ns"] else t,
                    fv["duration_ms"], fv["busbw_gbs"], s(m.host[i]), iv["pid"])
        out.add(op_key(row), row)
    return out
