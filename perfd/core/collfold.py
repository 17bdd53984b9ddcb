"""The collective analysis in phases that can run apart (pure): :func:`reduce` some ranks' collective
records to a :class:`CollectivePartial`, :func:`merge` partials, and
:func:`perfd.analytics.collectives.collective_analysis.finish` one with the job's step records and layout.
``analyze_collectives(records)`` is ``finish(reduce(records))``, so one aggregator and the engine's
root (which merges what the nodes' agents reduced) give the same analysis of the same operations.

What a partial keeps: one :class:`OpRow` per operation on one rank, keyed by the operation's identity
(:func:`op_key`: the aggregator's dedupe key), with only what the analysis reads of its record
(process group by reference to one shared :class:`GroupRef`; no dtype, raw name, algorithm bandwidth,
completion time or provenance). Why rows and not sums per group or per window:

- a rank's share of an iteration is the union of its intervals *per group class*, and a group's class
  needs the job's layout and world size (perfd.analytics.collectives.groups.classify_group), which
  only the root has; the windows come from the step records the root holds (finish's ``steps``);
- the wait asymmetry needs every member's duration of an op (the median of the others is what the
  last rank imposed), not only the minimum;
- counts (records per group and op) are idempotent only over identified operations.

So the join is a keyed union, which is associative, commutative and idempotent; two rows under one
key (two dumps showing the same op) resolve to the greater under :func:`_row_order` — the more
advanced state, then a timed one — so the resolution does not depend on the order partials come in.
Bounded (:class:`Retention`): each rank's newest operations (by enqueue time, then key), the same
whichever order the merges run in (the top k of a union is a join as well). Beside the rows, each
(rank, group)'s highest sequence number enqueued and completed is kept over every row ever merged in
(a max: a join too), whatever the retention lets go: it settles hangs.

What the retention lets go is not lost to the per-iteration shares: the root's store hands every row
a merge took in (:meth:`CollectivePartial.absorb`'s ``taken``: new, or a further state) to the job's
window fold (perfd.analytics.collectives.winfold), which has the layout and the step windows and
keeps per window and rank the unions per class the analysis reads, for as many iterations back as it
keeps. The agents send the store's share (``SENT_RETENTION``): what the root can read in time.

It sits beside perfd.core.stepfold, below both analytics and the engine: the engine's agents reduce and
its root merges, and the engine imports nothing of analytics (tests/test_layering.py); the
analysis (perfd.analytics.collectives) finishes what it folds.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from perfd.core.model import CollectiveRecord


@dataclass
class Progress:
    """Per (rank, process-group name, p2p): the highest sequence number seen enqueued / completed."""

    enqueued: dict[tuple[int, str, bool], int] = field(default_factory=dict)
    completed: dict[tuple[int, str, bool], int] = field(default_factory=dict)

    def add(self, rec: CollectiveRecord) -> None:
        seq = rec.p2p_seq_id if rec.is_p2p else rec.collective_seq_id
        if rec.rank is None or rec.pg_name is None or seq is None or rec.source != "flight_recorder":
            return
        key = (rec.rank, rec.pg_name, rec.is_p2p)
        if seq > self.enqueued.get(key, -1):
            self.enqueued[key] = seq
        if rec.state == "completed" and seq > self.completed.get(key, -1):
            self.completed[key] = seq

    def merge(self, other: Progress) -> None:
        """Take ``other``'s in: the highest of each (a join, as the partials that carry it)."""
        for mine, theirs in ((self.enqueued, other.enqueued), (self.completed, other.completed)):
            for key, seq in theirs.items():
                if seq > mine.get(key, -1):
                    mine[key] = seq

    def copy(self) -> Progress:
        return Progress(dict(self.enqueued), dict(self.completed))



def world_size_from(pg_ranks: Iterable[Sequence[int] | None], ranks: Iterable[int | None]) -> int | None:
    """The job's world size as the records show it: the largest group, or max rank + 1."""
    best = 0
    for g in pg_ranks:
        if g:
            best = max(best, len(set(g)))
    top = max((r for r in ranks if r is not None), default=None)
    if top is not None:
        best = max(best, top + 1)
    return best or None

# A key's parts are ints, strings, bools or None: sortable once None is put first.
OpKey = tuple[Hashable, ...]
_UNSEEN: list[int] = []  # a group not met yet (None is a group without ranks)
STATE_ORDER = {None: 0, "scheduled": 1, "started": 2, "completed": 3}  # Flight Recorder's progression


@dataclass(frozen=True)
class GroupRef:
    """A process group as a record names it (what the group table and the classification read).
    Its hash is computed once: a job's world group lists every rank (100,000 at the scale the engine
    is for), and the rows of a partial share one object per group."""

    pg_name: str | None
    comm_id: str | None
    pg_desc: str | None
    pg_ranks: tuple[int, ...] | None
    _hash: int = field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.pg_name, self.comm_id, self.pg_desc, self.pg_ranks)))

    def __hash__(self) -> int:
        return self._hash


class OpRow(NamedTuple):
    """One operation on one rank: the fields of its :class:`perfd.core.model.CollectiveRecord` that the
    analysis reads, under the same names. A named tuple, not a frozen dataclass: a shard makes one a
    rank an operation (600,000 an iteration at 100,000 ranks), and a frozen dataclass's ``__init__``
    (one ``object.__setattr__`` a field) cost 5.5 us of the ~11 us a row took to decode, a tuple's
    0.3 us (the wire's columns are zipped into rows: perfd.engine.collective_codec)."""

    source: str
    op: str
    group: GroupRef
    rank: int | None = None
    pg_id: int | None = None
    group_rank: int | None = None
    group_size: int | None = None
    nnodes: int | None = None
    collective_seq_id: int | None = None
    p2p_seq_id: int | None = None
    is_p2p: bool = False
    peer: int | None = None
    bytes: int | None = None
    state: str | None = None
    time_created_ns: int | None = None
    duration_ms: float | None = None
    busbw_gbs: float | None = None
    host: str | None = None
    pid: int | None = None

    @classmethod
    def of(cls, r: CollectiveRecord, group: GroupRef) -> OpRow:
        return cls(r.source, r.op, group,
                   r.rank, r.pg_id, r.group_rank, r.group_size, r.nnodes, r.collective_seq_id, r.p2p_seq_id,
                   r.is_p2p, r.peer, r.bytes, r.state, r.time_created_ns, r.duration_ms, r.busbw_gbs,
                   r.host, r.pid)

    def record(self, job: str, pg_ranks: list[int] | None) -> CollectiveRecord:
        """As a record; ``pg_ranks``: its group's ranks (one list a group, shared by its records)."""
        g = self.group
        return CollectiveRecord(
            job=job, source=self.source, op=self.op, rank=self.rank, pg_id=self.pg_id, pg_name=g.pg_name,
            pg_desc=g.pg_desc, comm_id=g.comm_id, pg_ranks=pg_ranks,
            group_rank=self.group_rank, group_size=self.group_size, nnodes=self.nnodes,
            collective_seq_id=self.collective_seq_id, p2p_seq_id=self.p2p_seq_id, is_p2p=self.is_p2p,
            peer=self.peer, bytes=self.bytes, state=self.state, time_created_ns=self.time_created_ns,
            duration_ms=self.duration_ms, busbw_gbs=self.busbw_gbs, host=self.host, pid=self.pid)


def op_key(r: CollectiveRecord | OpRow) -> OpKey:
    """One operation's identity: Flight Recorder's (rank, process group uid, sequence number, p2p);
    else the process, communicator, rank in it, sequence number and op (the Inspector's)."""
    seq = r.p2p_seq_id if r.is_p2p else r.collective_seq_id
    if r.rank is not None and r.pg_id is not None:
        return (r.source, r.rank, r.pg_id, seq, r.is_p2p)
    comm = r.group.comm_id or r.group.pg_name if isinstance(r, OpRow) else r.comm_id or r.pg_name
    return (r.source, r.host, r.pid, comm, r.group_rank, seq, r.is_p2p, r.op)


def _sortable(v: Hashable) -> tuple[int, Hashable]:
    return (0, 0) if v is None else (1, v)


def sort_key(key: OpKey) -> tuple[object, ...]:
    """A total order of keys: their shape first (the two kinds differ in length), None first."""
    return (len(key), *(_sortable(v) for v in key))


def _row_order(row: OpRow) -> tuple[object, ...]:
    """Which of two rows of one operation a merge keeps: the further state, a timed one, then the
    whole row, every field (any total order would do: it only has to be the same for every merge;
    a NaN duration, which no source writes, would not be ordered)."""
    return (STATE_ORDER.get(row.state, 0), row.duration_ms is not None,
            *(_sortable(v) for v in (row.state, row.duration_ms, row.time_created_ns, row.busbw_gbs,
                                     row.bytes, row.op, row.group_size, row.nnodes, row.peer,
                                     row.group.pg_name, row.group.comm_id, row.group.pg_desc,
                                     row.group.pg_ranks, row.source, row.rank, row.pg_id, row.group_rank,
                                     row.collective_seq_id, row.p2p_seq_id, row.is_p2p, row.host, row.pid)))


def _stream(key: OpKey) -> OpKey:
    """What :class:`Retention` bounds: the rank (source and rank), else the process's communicator
    (source, host, pid, communicator: the Inspector's, which knows no global rank)."""
    return key[:2] if len(key) == 5 else key[:4]


@dataclass(frozen=True)
class Retention:
    """How many operations a partial keeps: each rank's (each process's, without a rank) newest
    ``per_rank``, and no more than ``per_job`` in all, shared evenly over its ranks (at least one
    each: a rank is never dropped whole). Keeping the top k of each rank of a union is a join as long
    as k only shrinks as ranks come in, which ``per_job // ranks`` does."""

    per_rank: int | None = None
    per_job: int | None = None

    def k(self, streams: int) -> int | None:
        ks = [k for k in (self.per_rank, None if self.per_job is None else self.per_job // max(1, streams))
              if k is not None]
        return max(1, min(ks)) if ks else None


# What the aggregator's store keeps of what came reduced (the engine path), and what an agent sends no
# more of: each rank's newest 512 operations (~25 iterations of a job running ~20 collectives an
# iteration a rank), 250,000 a job in all (12.5 x the records as sent it keeps a job; ~290 bytes a row
# in memory): at 8,000 ranks 31 a rank, at 100,000 ranks 2 — every rank seen, few of its operations
# (its per-iteration shares are folded per window as its operations come: analytics/collectives/winfold).
# The analysis of 200,000 rows of a 100,000-rank job took 19.7 s of CPU on the 2-core VM
# (perfd bench collectives, benchmarks/README.md).
REDUCED_RETENTION = Retention(per_rank=512, per_job=250_000)
# What a node's agent sends of it: the store's share, no more (each rank's newest k of a dump, k =
# min(512, 250,000 / ranks)). The root folds every operation it merges into per-window figures
# (perfd.analytics.collectives.winfold) before its store lets it go, so a rank whose dump holds all of
# a window's operations keeps that window's share however few rows the store holds. Not more: the
# root reads every row it is sent, ~29 µs each (decode, merge, fold: 1.38 ms for a node's 48 rows,
# perfd bench collectives), and sending every rank's every operation of a 100,000-rank job running 6
# collectives an iteration is 600,000 rows an iteration, 17 s of the root's one core for a 2 s
# iteration: the root, which also folds the job's step records, would fall behind for good. At this
# share a dump costs the root at most ~7 s of CPU whatever the job's size (and where the job's windows
# were folded below the root, its agents send a round of it only as often as the root reads it at
# ~0.12 core: perfd.engine.shares); where the root folds the windows, at 8,000 ranks (31 a rank: a 10 s
# dump of 6 collectives an iteration whole) every window is covered, at 100,000 (2 a rank) few are, and
# those are absent, not invented.
SENT_RETENTION = REDUCED_RETENTION


@dataclass
class CollectivePartial:
    """Some ranks' operations of one job, keyed by :func:`op_key`, held per rank (``streams``: what
    the retention counts, so that a merge bounds only the ranks it touched). Equal as sets: two
    partials holding the same rows compare equal whatever order they were built in."""

    job: str
    streams: dict[OpKey, dict[OpKey, OpRow]] = field(default_factory=dict)
    # Each (rank, group, p2p)'s highest sequence number enqueued and completed over every row it was
    # made of, kept whole whatever the retention lets go: what settles a hang (hangs.merge_hangs) is
    # a rank's progress on the hung group, which its newest rows, on other groups, may no longer show.
    progress: Progress = field(default_factory=Progress)
    _kept: int | None = field(default=None, compare=False, repr=False)  # the k last applied to all

    @property
    def ops(self) -> dict[OpKey, OpRow]:
        return {k: row for rows in self.streams.values() for k, row in rows.items()}

    def __len__(self) -> int:
        return sum(len(rows) for rows in self.streams.values())

    def add(self, key: OpKey, row: OpRow) -> bool:
        """Whether ``row`` went in: an operation not held, or a further state of one held."""
        rows = self.streams.setdefault(_stream(key), {})
        cur = rows.get(key)
        if cur is None or (cur != row and _row_order(row) > _row_order(cur)):
            rows[key] = row
            return True
        return False

    def absorb(self, other: CollectivePartial, keep: Retention | None = None,
               taken: list[OpRow] | None = None) -> int:
        """Merge ``other`` in, in place (the root's running merge: linear in ``other`` unless new
        ranks shrink every rank's share of ``keep.per_job``), then bound what it touched. ``taken``:
        gets the rows that went in (new, or a further state), before the bound lets any go — what the
        root folds per window (perfd.analytics.collectives.winfold). Returns how many rows the bound
        let go (counted without walking every rank: ``len`` of a 100,000-rank partial does)."""
        if other.job != self.job:
            raise ValueError(f"merging partials of two jobs ({self.job!r}, {other.job!r})")
        self.progress.merge(other.progress)
        for rows in other.streams.values():
            for key, row in rows.items():
                if self.add(key, row) and taken is not None:
                    taken.append(row)
        k = keep.k(len(self.streams)) if keep is not None else None
        if k is not None and (self._kept is None or k < self._kept):
            return self._bound_all(keep)
        return sum(_bound_stream(self.streams[stream], k) for stream in other.streams)

    def bound(self, keep: Retention | None) -> CollectivePartial:
        """This partial with each rank's newest ``keep.k(ranks)`` operations (by enqueue time, then
        key): the same set whatever order the rows were merged in, since an op's enqueue time is its
        own (every dump that shows it shows the same). None: unbounded."""
        self._bound_all(keep)
        return self

    def _bound_all(self, keep: Retention | None) -> int:
        k = keep.k(len(self.streams)) if keep is not None else None
        gone = sum(_bound_stream(rows, k) for rows in self.streams.values())
        self._kept = k
        return gone

    def ordered(self) -> list[tuple[OpKey, OpRow]]:
        """The rows in the order the analysis reads them, whatever order they came in: rank by rank,
        each rank's in enqueue order (the order its dumps list them), then by key. Its groups table
        lists groups in the order their first operation comes in this order: for one aggregator fed a
        node's dumps rank by rank, the order they arrived in."""
        out = []
        for stream in sorted(self.streams, key=sort_key):
            out.extend(sorted(self.streams[stream].items(), key=_enqueue_order))
        return out

    def records(self) -> list[CollectiveRecord]:
        """The rows as records, in :meth:`ordered` order; the records of a group share one list of its
        ranks (a world group of 100,000 ranks is one list, not one a record)."""
        lists: dict[GroupRef, list[int] | None] = {}
        out = []
        for _, row in self.ordered():
            ranks = lists.get(row.group, _UNSEEN)
            if ranks is _UNSEEN:
                ranks = lists[row.group] = list(row.group.pg_ranks) if row.group.pg_ranks else None
            out.append(row.record(self.job, ranks))
        return out

    def ranks(self) -> set[int]:
        return {row.rank for rows in self.streams.values() for row in rows.values() if row.rank is not None}


def reduce(job: str, records: Iterable[CollectiveRecord], keep: Retention | None = None) -> CollectivePartial:
    """``records`` as a partial of ``job`` (the caller picks the job's: the analysis is per job)."""
    out = CollectivePartial(job)
    groups: dict[GroupRef, GroupRef] = {}  # one object per group: the rows share it
    # Records that share a ranks list (a world group lists every rank) make its group once
    made: dict[tuple[int, str | None, str | None, str | None], tuple[list[int] | None, GroupRef]] = {}
    for r in records:
        key = (id(r.pg_ranks), r.pg_name, r.comm_id, r.pg_desc)
        hit = made.get(key)
        if hit is None or hit[0] is not r.pg_ranks:
            g = GroupRef(r.pg_name, r.comm_id, r.pg_desc, tuple(r.pg_ranks) if r.pg_ranks else None)
            hit = made[key] = (r.pg_ranks, groups.setdefault(g, g))
        out.add(op_key(r), OpRow.of(r, hit[1]))
        out.progress.add(r)
    return out.bound(keep)


def for_sending(p: CollectivePartial, keep: Retention) -> CollectivePartial:
    """``p`` as a sender (a node's agent) bounds it before the store that merges it would: each rank's
    newest ``keep.k(world)``, ``world`` the job's ranks as its rows show them (the largest group, or
    the highest rank + 1). Once every rank of the job reported, the store's k over them is no larger,
    so what is dropped here the store would drop as well; until then it may hold fewer of a rank's
    older operations than it could. The engine's agents send with ``SENT_RETENTION`` (the store's
    share: the root folds each per window before its store lets it go)."""
    k = keep.k(world_of(p))
    for rows in p.streams.values():
        _bound_stream(rows, k)
    return p


def world_of(p: CollectivePartial) -> int:
    """The job's ranks as ``p``'s rows show them (the largest group, or the highest rank + 1; its
    streams where neither shows)."""
    groups = {id(row.group): row.group for rows in p.streams.values() for row in rows.values()}
    world = world_size_from((g.pg_ranks for g in groups.values()),  # each group once: a world group is big
                            (row.rank for rows in p.streams.values() for row in rows.values()))
    return world or len(p.streams)


def merge(a: CollectivePartial, b: CollectivePartial, keep: Retention | None = None) -> CollectivePartial:
    """The join of two partials of one job (a new partial; ``a`` and ``b`` are left as they are)."""
    out = CollectivePartial(a.job, {k: dict(v) for k, v in a.streams.items()}, a.progress.copy()).bound(keep)
    out.absorb(b, keep)
    return out


def merge_all(job: str, parts: Sequence[CollectivePartial],
              keep: Retention | None = None) -> CollectivePartial:
    out = CollectivePartial(job)
    for p in parts:
        out.absorb(p, keep)
    return out


def _enqueue_order(kv: tuple[OpKey, OpRow]) -> tuple[object, ...]:
    return (_sortable(kv[1].time_created_ns), sort_key(kv[0]))


def _bound_stream(rows: dict[OpKey, OpRow], max_ops: int | None) -> int:
    """The stream's oldest rows past ``max_ops`` let go, in :func:`_enqueue_order`: those enqueued
    before the cut's time, then of those at it the first by key. The enqueue times alone decide all
    but a tie at the cut, so the key order (a tuple made a field at a time) is built for those only:
    sorting every row by the whole order was most of the root's merge of its agents' operations
    (py-spy on ``perfd bench engine --collectives``), done at every message for each rank in it."""
    if max_ops is None or len(rows) <= max_ops:
        return 0
    gone = len(rows) - max_ops
    times = [_NO_TIME if row.time_created_ns is None else row.time_created_ns for row in rows.values()]
    cut = sorted(times)[gone - 1]
    below = [key for key, t in zip(rows, times, strict=True) if t < cut]
    at = [key for key, t in zip(rows, times, strict=True) if t == cut]
    if len(below) + len(at) > gone:
        at = sorted(at, key=sort_key)[:gone - len(below)]
    for key in below + at:
        del rows[key]
    return gone


# An untimed row's place in the enqueue order: before every timed one (_sortable's None first)
_NO_TIME = float("-inf")
