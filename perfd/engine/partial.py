"""A job's iteration as part of its nodes saw it (:class:`Partial`), and its wire form.

A node's agent turns what its ranks sent into one Partial per (job, iteration) — a 100,000-rank
iteration is then one message per node, not one per rank — a shard folds its nodes' into one, and the
job's root folds the shards'. Rank records fold with :func:`perfd.core.stepfold.fold_ranks` (a join:
associative, commutative, idempotent); job-level records (a Megatron log's ``last``) are kept as sent,
one per scope, the newest copy winning. The ranks and the node messages folded in travel with it:
the root knows the world it saw and counts a message folded twice. Pure.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from perfd.core.collfold import CollectivePartial
from perfd.core.model import StepRecord
from perfd.core.stepfold import RankFold
from perfd.core.winfigures import WindowFigures
from perfd.engine import collective_codec, figures_codec
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.record_codec import step_from_pb, step_to_pb


class Partial:
    """``fold`` is built from the rank records folded in when read (perfd.core.stepfold.RankFold):
    merging is linear in what is merged, whatever was folded before."""

    def __init__(self, job: str, iteration: int, fold: StepRecord | None = None, ranks: Iterable[int] = (),
                 job_level: dict[str, StepRecord] | None = None, messages: Iterable[str] = (),
                 new_run: bool = False) -> None:
        self.job, self.iteration = job, iteration
        self._fold = RankFold([fold] if fold is not None else [])
        self.ranks: set[int] = set(ranks)
        self.job_level: dict[str, StepRecord] = dict(job_level or {})  # scope -> record
        self.messages: set[str] = set(messages)  # node messages folded in
        self.complete = False  # (the root's) every rank of the job is in: counted once
        # (the root's) when its fold last went to the store, and whether more was folded in since
        self.handed_at: float | None = None
        self.unhanded = False
        self.fresh_job_level = False  # (the root's) a job-level record came since it was handed on
        # A rank folded in began a new process at this iteration (its node's agent saw its step hook's
        # pid change): the job restarted. Or-ed when merged, so still a join.
        self.new_run = new_run

    @property
    def fold(self) -> StepRecord | None:
        """The rank records folded (scope "all"), a new record each read; None: none folded."""
        return self._fold.record()

    def fold_end(self) -> float | None:
        """The fold's end (the latest rank's), without building its record."""
        return self._fold.end

    def add_records(self, records: Iterable[StepRecord]) -> None:
        """Fold records of this job and iteration in."""
        ranked = []
        for r in records:
            if isinstance(r.rank, int):
                ranked.append(r)
                self.ranks.add(r.rank)
            else:
                self.job_level[str(r.rank)] = r
        self._fold.add(ranked)

    def merge(self, other: Partial) -> list[str]:
        """Fold ``other`` (same job and iteration) in; returns the node messages it carried that were
        already in (a redelivery: folded once all the same)."""
        again = sorted(self.messages & other.messages)
        self.messages |= other.messages
        self.ranks |= other.ranks
        self.job_level.update(other.job_level)
        self._fold.add_fold(other._fold)
        self.new_run = self.new_run or other.new_run
        return again


def partials_of(records: Iterable[StepRecord], message: str | None = None,
                new_runs: Collection[tuple[str, int]] = ()) -> list[Partial]:
    """One Partial per (job, iteration) of ``records``, in first-seen order; ``message``: the id of
    the node message they arrive in; ``new_runs``: the (job, iteration)s where a rank began a new
    process (:class:`RunMarks`)."""
    groups: dict[tuple[str, int], list[StepRecord]] = {}
    for r in records:
        groups.setdefault((r.job, r.iteration), []).append(r)
    out = []
    for (job, it), rs in groups.items():
        p = Partial(job, it, messages=[message] if message else [], new_run=(job, it) in new_runs)
        p.add_records(rs)
        out.append(p)
    return out


class RunMarks:
    """A node's agent's memory of its ranks' processes (the step hook's pid on each rank record): a
    rank seen from another process than before began a new run of its job there. Bounded: ranks
    come from the records, which come from the node's processes."""

    MAX_RANKS = 4096

    def __init__(self) -> None:
        self._pid: dict[tuple[str, int], str] = {}

    def new_runs(self, records: Iterable[StepRecord]) -> set[tuple[str, int]]:
        """The (job, iteration)s of ``records`` where a rank's process changed."""
        out: set[tuple[str, int]] = set()
        for r in records:
            pid = r.fields.get("pid")
            if pid is None or not isinstance(r.rank, int) or r.source is None or r.source.collector != "hook":
                continue
            key = (r.job, r.rank)
            before = self._pid.get(key)
            if before is None and len(self._pid) >= self.MAX_RANKS:
                self._pid.clear()
            self._pid[key] = pid
            if before is not None and before != pid:
                out.add((r.job, r.iteration))
        return out


def to_pb(p: Partial, m: pb.Partial) -> None:
    m.job, m.iteration = p.job, p.iteration
    fold = p.fold
    if fold is not None:
        step_to_pb(fold, m.fold)
    m.ranks_le = array("I", sorted(p.ranks)).tobytes()  # the machines this runs on are little-endian
    for rec in p.job_level.values():
        step_to_pb(rec, m.job_level.add())
    m.messages.extend(sorted(p.messages))
    m.new_run = p.new_run


def from_pb(m: pb.Partial) -> Partial:
    """ValueError for a malformed partial (the caller counts and drops it)."""
    if len(m.ranks_le) % 4:
        raise ValueError(f"ranks_le of {len(m.ranks_le)} bytes is not whole uint32s")
    ranks = array("I")
    ranks.frombytes(m.ranks_le)
    fold = step_from_pb(m.fold) if m.HasField("fold") else None
    if fold is not None and (fold.job != m.job or fold.iteration != m.iteration):
        raise ValueError("a partial's fold is of another job or iteration")
    job_level = {}
    for jm in m.job_level:
        rec = step_from_pb(jm)
        if rec.job != m.job or rec.iteration != m.iteration or isinstance(rec.rank, int):
            raise ValueError("a partial's job-level record is of another job, iteration or a rank")
        job_level[str(rec.rank)] = rec
    return Partial(m.job, m.iteration, fold, ranks, job_level, m.messages, m.new_run)


def encode(batch_id: str, sender: str, created_ns: int, partials: Sequence[Partial],
           job_info_json: dict[str, str] | None = None, records: pb.Batch | None = None,
           collectives: Sequence[CollectivePartial] = (), figures: Sequence[WindowFigures] = (),
           collectives_folded: bool = False, to_partition: bool = False) -> bytes:
    """``records``: a node's events (and, from an agent that does not reduce them, its collective
    records); ``collectives``: its collective records reduced: on a records message (without partials
    beside) the store's share, ``collectives_folded`` when every operation also went to the shards; on
    a node message (beside its partials) every operation, for its shard's window fold. ``figures``:
    a shard's window figures (perfd.core.winfigures), to the job's root. ``to_partition``: a node message
    (what routes it; partials or job info say so too)."""
    b = pb.EngineBatch(id=batch_id, sender=sender, created_ns=created_ns,
                       collectives_folded=collectives_folded, to_partition=to_partition)
    for p in partials:
        to_pb(p, b.partials.add())
    if job_info_json:
        b.job_info_json.update(job_info_json)
    if records is not None:
        b.records.CopyFrom(records)
    for c in collectives:
        collective_codec.to_pb(c, b.collective_partials.add())
    for f in figures:
        figures_codec.to_pb(f, b.window_figures.add())
    return b.SerializeToString()


BATCH_ID_ROOM = 256  # bytes kept for a batch's id (set once its partials are known)


def encode_batches(next_id: Callable[[], str], sender: str, created_ns: int, partials: Sequence[Partial],
                   job_info_json: dict[str, str] | None, max_bytes: int) -> list[tuple[str, bytes]]:
    """``partials`` in as few EngineBatch messages as fit ``max_bytes`` each (the engine's largest
    message), the job info in the first: (id, bytes) each, ids from ``next_id``. ValueError for a
    partial that alone does not fit (a shard caps its partials' ranks so that none comes near)."""
    out: list[tuple[str, bytes]] = []

    def batch() -> pb.EngineBatch:
        return pb.EngineBatch(sender=sender, created_ns=created_ns)

    b = batch()
    if job_info_json:
        b.job_info_json.update(job_info_json)
    size = b.ByteSize() + BATCH_ID_ROOM
    for p in partials:
        m = pb.Partial()
        to_pb(p, m)
        n = m.ByteSize() + 8  # its field's tag and length
        if n + BATCH_ID_ROOM > max_bytes:
            raise ValueError(f"a partial of {len(p.ranks)} ranks is {n} bytes, over the {max_bytes} a "
                             "message may carry")
        if len(b.partials) and size + n > max_bytes:
            b.id = next_id()
            out.append((b.id, b.SerializeToString()))
            b = batch()
            size = b.ByteSize() + BATCH_ID_ROOM
        b.partials.append(m)
        size += n
    if len(b.partials) or len(b.job_info_json):
        b.id = next_id()
        out.append((b.id, b.SerializeToString()))
    return out


@dataclass
class Decoded:
    id: str
    sender: str
    created_ns: int
    partials: list[Partial]
    job_info_json: dict[str, str]
    records: pb.Batch | None = None  # a node's events and collective records, as sent
    collectives: list[CollectivePartial] = field(default_factory=list)  # its collective records reduced
    figures: list[WindowFigures] = field(default_factory=list)  # a shard's window figures
    collectives_folded: bool = False  # a records message's collectives went to the shards' folds too
    to_partition: bool = False  # a node message, whatever it carries
    # the same as they came, undecoded (decode(..., figures_raw=True): what a shard hands on as it is)
    figures_pb: list[pb.WindowFigures] = field(default_factory=list)

    @property
    def is_node_message(self) -> bool:
        """To the job's partition of the node stream (its shard), not the records stream."""
        return self.to_partition or (self.records is None and not self.collectives)

    @property
    def events_only(self) -> bool:
        """A records message of events alone: to the events stream (perfd.engine.subjects)."""
        return (not self.is_node_message and not self.collectives and self.records is not None
                and not self.records.collectives)

    @property
    def records_job(self) -> str:
        """The job a records message is of ("": a node's events of no job): one per message."""
        if self.collectives:
            return self.collectives[0].job

        r = self.records
        if r is None:
            return ""
        return r.events[0].job if r.events else (r.collectives[0].job if r.collectives else "")


def decode(data: bytes, figures_raw: bool = False) -> Decoded:
    """ValueError for bytes that are not an EngineBatch (protobuf's DecodeError is not one).
    ``figures_raw``: the window figures left as protobuf (``figures_pb``), not made rows (a shard hands
    an agent's figures on as they came: decoded and encoded again they were most of its CPU for them)."""
    b = pb.EngineBatch()
    try:
        b.ParseFromString(data)
    except DecodeError as exc:
        raise ValueError(f"not an EngineBatch: {exc}") from None
    return Decoded(b.id, b.sender, b.created_ns, [from_pb(m) for m in b.partials], dict(b.job_info_json),
                   b.records if b.HasField("records") else None,
                   [collective_codec.from_pb(m) for m in b.collective_partials],
                   [] if figures_raw else [figures_codec.from_pb(m) for m in b.window_figures],
                   b.collectives_folded, b.to_partition, list(b.window_figures) if figures_raw else [])
