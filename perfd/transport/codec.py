"""Pure conversions between perfd.core.model values and the wire messages of ``perfd.proto``.

Samples travel columnar (three fixed-width little-endian arrays in bytes fields: series id,
timestamp, value) and stay columnar on the receiving side: :func:`decode_batch` hands back
``array.array`` columns made with one copy each, so the aggregator pays no Python object per
sample on its hot path (docs/design.md §3 "Transport"). The arrays are laid out by hand rather than as
packed repeated fields because the protobuf runtime turns each element of those into a Python
object when read, ~60 ns each — ~40 µs of a 200-sample batch, the aggregator's largest cost per
batch at 2,000 agents. Batches in the packed form (an older agent's spool) are still decoded.

Series and their ids are in perfd.transport.series; the step, event and collective records in
perfd.transport.record_codec. This module frames them into Batches, Hellos and Commands.
"""

from __future__ import annotations

import sys
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from perfd.core.model import CollectiveRecord, Provenance, Sample, StepRecord, label_set
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.record_codec import (
    DecodedEvent,
    collective_from_pb,
    collective_to_pb,
    event_from_pb,
    event_to_pb,
    step_from_pb,
    step_to_pb,
)
from perfd.transport.series import Series, SeriesKey, SeriesTable

# The sample columns' array type codes: uint32 ids, int64 times (epoch ns), float64 values.
U32 = next(c for c in "IL" if array(c).itemsize == 4)
I64, F64 = "q", "d"
_F64_BYTES = array(F64).itemsize
_SWAP = sys.byteorder != "little"  # the wire is little-endian
_N = TypeVar("_N", int, float)  # a sample column's values
# The Batch fields that carry samples and their definitions, in both forms (the journal leaves
# them out: node samples are not state the analysis keeps).
SAMPLE_FIELDS = ("series", "series_ids", "timestamps_ns", "values", "series_ids_le", "timestamps_ns_le",
                 "values_le")


# Command kinds (Command.kind) the agent executes: a capture (perfd/agent/capture_executor.py), the Python
# stacks of a job's ranks (perfd/agent/stacks.py; the aggregator asks when a stall opens).
COMMAND_CAPTURE = "capture"
COMMAND_STACKS = "stacks"


@dataclass(frozen=True)
class Command:
    """An instruction from the aggregator to one agent (capture, dump_flight_recorder, config)."""

    kind: str
    job: str = ""
    ranks: tuple[int, ...] = ()  # empty: every rank of the job on that agent
    args: Mapping[str, str] = field(default_factory=dict)
    id: str = ""


@dataclass(frozen=True)
class HelloInfo:
    """What an agent said about itself when its stream opened."""

    agent_id: str
    node: str
    version: str
    jobs: tuple[str, ...]
    capabilities: dict[str, str]
    spool_epoch: str
    n_series: int
    peer: str = ""


@dataclass(slots=True)
class DecodedBatch:
    """One batch as the aggregator sees it. Samples stay columnar.

    ``series_ids``, ``timestamps_ns`` and ``values`` are equal-length ``array.array`` columns
    (type codes U32, I64, F64: index them, slice them, or hand them to ``numpy.frombuffer``).
    ``series`` is the stream's whole id → Series table (shared, updated in place by later
    batches); ``new_series`` lists the ids (re)defined since the previous batch delivered on this
    stream — for the first batch of a stream that includes every id of the agent's Hello — so a
    consumer that caches per-series state keyed by (agent, id) knows when to refresh it.
    """

    agent_id: str
    seq: int
    created_ns: int
    series: Mapping[int, Series]
    new_series: list[int]
    series_ids: array[int]
    timestamps_ns: array[int]
    values: array[float]
    steps: list[StepRecord]
    events: list[DecodedEvent]
    job_info_json: dict[str, str]
    dropped_batches: int  # the agent's cumulative spool losses, as it reports them
    dropped_samples: int
    collectives: list[CollectiveRecord] = field(default_factory=list)

    @property
    def n_samples(self) -> int:
        return len(self.values)

# ------------------------------------------------------------------------------------ batches


def encode_batch(
    agent_id: str,
    seq: int,
    samples: Iterable[Sample],
    steps: Iterable[StepRecord],
    events: Iterable[Mapping[str, object]],
    table: SeriesTable,
    *,
    columns: tuple[Sequence[int], Sequence[int], Sequence[float]] | None = None,
    job_info_json: Mapping[str, str] | None = None,
    created_ns: int | None = None,
    dropped_batches: int = 0,
    dropped_samples: int = 0,
    collectives: Iterable[CollectiveRecord] = (),
) -> pb.Batch:
    """Build one Batch. ``samples`` are Sample objects; ``columns`` is the cheaper path for a
    collector that resolved its series ids once (``table.id_for``): (series_ids, timestamps_ns,
    values), appended after ``samples``. ``collectives`` are NCCL / Flight Recorder records."""
    ids: array[int] = array(U32)
    ts: array[int] = array(I64)
    vals: array[float] = array(F64)
    lookup = table._ids
    for s in samples:  # hot loop on the agent: one dict lookup per sample, no message per sample
        lab = s.labels
        key: SeriesKey = (s.name, label_set(lab) if lab else ())
        sid = lookup.get(key)
        if sid is None:
            sid = table._add(key)
        ids.append(sid)
        ts.append(int(s.time * 1e9))
        vals.append(s.value)
    b = pb.Batch(agent_id=agent_id, seq=seq,
                 created_ns=time.time_ns() if created_ns is None else created_ns,
                 dropped_batches=dropped_batches, dropped_samples=dropped_samples)
    b.series.extend(table.definitions(table.take_new()))
    if columns is not None:
        cid, cts, cval = columns
        if not len(cid) == len(cts) == len(cval):
            raise ValueError(f"columns differ in length: {len(cid)}, {len(cts)}, {len(cval)}")
        ids.extend(cid)
        ts.extend(cts)
        vals.extend(cval)
    if vals:
        b.series_ids_le, b.timestamps_ns_le, b.values_le = _le_bytes(ids), _le_bytes(ts), _le_bytes(vals)
    for rec in steps:
        step_to_pb(rec, b.steps.add())
    for ev in events:
        event_to_pb(ev, b.events.add())
    rank_lists: dict[tuple[int, ...], int] = {}
    for crec in collectives:
        collective_to_pb(crec, b.collectives.add(), rank_lists, b)
    if job_info_json:
        b.job_info_json.update(job_info_json)
    return b


def _le_bytes(col: array[_N]) -> bytes:
    if _SWAP:
        col = array(col.typecode, col)
        col.byteswap()
    return col.tobytes()


def _le_array(col: array[_N], raw: bytes, what: str) -> array[_N]:
    """``raw`` (little-endian values) into the empty column ``col``."""
    if len(raw) % col.itemsize:
        raise ValueError(f"{what}: {len(raw)} bytes is not a whole number of {col.itemsize}-byte values")
    col.frombytes(raw)
    if _SWAP:
        col.byteswap()
    return col


def sample_columns(batch: pb.Batch) -> tuple[array[int], array[int], array[float]]:
    """The batch's (series ids, timestamps, values) as arrays, from either wire form; ValueError
    when they differ in length or the batch mixes the forms."""
    raw = (batch.series_ids_le, batch.timestamps_ns_le, batch.values_le)
    if any(raw):
        if batch.values or batch.series_ids or batch.timestamps_ns:
            raise ValueError(f"batch {batch.seq}: samples in both the packed and the array form")
        ids: array[int] = array(U32)
        ts: array[int] = array(I64)
        vals: array[float] = array(F64)
        cols = (_le_array(ids, raw[0], "series_ids_le"), _le_array(ts, raw[1], "timestamps_ns_le"),
                _le_array(vals, raw[2], "values_le"))
    else:  # an older agent's packed form (or no samples)
        cols = (array(U32, batch.series_ids), array(I64, batch.timestamps_ns), array(F64, batch.values))
    if not len(cols[0]) == len(cols[1]) == len(cols[2]):
        raise ValueError(f"batch {batch.seq}: columns differ in length: {len(cols[0])}, {len(cols[1])}, "
                         f"{len(cols[2])}")
    return cols


def sample_count(batch: pb.Batch) -> int:
    """How many samples the batch carries, in either wire form, without decoding them."""
    return len(batch.values) + len(batch.values_le) // _F64_BYTES


AdmitSeries = Callable[[int, Series], bool]


def _define(defs: Iterable[pb.SeriesDef], series_by_id: dict[int, Series], admit: AdmitSeries | None) -> None:
    """Put ``defs`` into the stream's table; one ``admit`` refuses is left out — an id redefined as
    a refused series loses its old meaning — so a refused series holds no memory here."""
    for d in defs:
        s = Series(d.name, label_set(d.labels))
        if admit is None or admit(d.id, s):
            series_by_id[d.id] = s
        else:
            series_by_id.pop(d.id, None)


def decode_batch(batch: pb.Batch, series_by_id: dict[int, Series],
                 admit: AdmitSeries | None = None) -> DecodedBatch:
    """Decode one Batch; ``series_by_id`` (the stream's table) is updated with its definitions
    (those ``admit`` accepts). ``new_series`` lists every id the batch defined, refused or not.

    Raises ValueError on an inconsistent batch (columns of different lengths or forms, bad rank
    scope, a collective naming a rank list the batch does not have).
    """
    _define(batch.series, series_by_id, admit)
    new_ids = [d.id for d in batch.series]
    ids, ts, vals = sample_columns(batch)
    return DecodedBatch(
        agent_id=batch.agent_id,
        seq=batch.seq,
        created_ns=batch.created_ns,
        series=series_by_id,
        new_series=new_ids,
        series_ids=ids,
        timestamps_ns=ts,
        values=vals,
        # Empty containers skipped: most batches carry only samples or a step record.
        steps=[step_from_pb(s) for s in batch.steps] if batch.steps else [],
        events=[event_from_pb(e) for e in batch.events] if batch.events else [],
        job_info_json=dict(batch.job_info_json) if batch.job_info_json else {},
        dropped_batches=batch.dropped_batches,
        dropped_samples=batch.dropped_samples,
        collectives=_collectives_from_pb(batch),
    )


def _collectives_from_pb(batch: pb.Batch) -> list[CollectiveRecord]:
    if not batch.collectives:
        return []
    lists = [list(rl.ranks) for rl in batch.rank_lists]
    provs: dict[tuple[str, str], Provenance] = {}
    return [collective_from_pb(c, lists, provs) for c in batch.collectives]


def frame_batch(batch_bytes: bytes) -> bytes:
    """Wrap serialized Batch bytes as a serialized ``AgentMessage{batch}`` without re-encoding.

    A length-delimited field on the wire is tag, varint length, payload; the tag of
    ``AgentMessage.batch`` (field 2, wire type 2) is 0x12. The spool stores Batch bytes, and a
    resend after a reconnect costs one memcpy instead of a parse and a re-serialization.
    """
    n = len(batch_bytes)
    head = bytearray(b"\x12")
    while n >= 0x80:
        head.append((n & 0x7F) | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head) + batch_bytes


# ------------------------------------------------------------------------------------ hello / commands


def encode_hello(agent_id: str, node: str, version: str, jobs: Iterable[str],
                 capabilities: Mapping[str, str], spool_epoch: str, table: SeriesTable) -> pb.AgentMessage:
    return pb.AgentMessage(hello=pb.Hello(agent_id=agent_id, node=node, version=version, jobs=list(jobs),
                                          capabilities=dict(capabilities), spool_epoch=spool_epoch,
                                          series=table.definitions()))


def decode_hello(h: pb.Hello, series_by_id: dict[int, Series] | None, peer: str = "",
                 admit: AdmitSeries | None = None) -> HelloInfo:
    """``series_by_id`` receives the Hello's definitions (those ``admit`` accepts); None: the
    caller holds them already."""
    if series_by_id is not None:
        _define(h.series, series_by_id, admit)
    return HelloInfo(agent_id=h.agent_id, node=h.node, version=h.version, jobs=tuple(h.jobs),
                     capabilities=dict(h.capabilities), spool_epoch=h.spool_epoch,
                     n_series=len(h.series), peer=peer)


def command_to_pb(cmd: Command) -> pb.Command:
    return pb.Command(id=cmd.id, kind=cmd.kind, job=cmd.job, ranks=list(cmd.ranks), args=dict(cmd.args))


def command_from_pb(m: pb.Command) -> Command:
    return Command(kind=m.kind, job=m.job, ranks=tuple(m.ranks), args=dict(m.args), id=m.id)
