"""Pure conversions between perfd.model values and the wire messages of ``perfd.proto``.

Samples travel columnar (three fixed-width little-endian arrays in bytes fields: series id,
timestamp, value) and stay columnar on the receiving side: :func:`decode_batch` hands back
``array.array`` columns made with one copy each, so the aggregator pays no Python object per
sample on its hot path (DESIGN.md §3 "Transport"). The arrays are laid out by hand rather than as
packed repeated fields because the protobuf runtime turns each element of those into a Python
object when read, ~60 ns each — ~40 µs of a 200-sample batch, the aggregator's largest cost per
batch at 2,000 agents. Batches in the packed form (an older agent's spool) are still decoded.

A series (metric name + bounded labels) gets a small integer id from the agent's
:class:`SeriesTable`. A batch carries the definitions of the series first used since the previous
batch; every new stream starts with the whole table in its Hello, because a batch resent after a
reconnect (or after an agent restart) may use ids whose definition travelled in a batch that was
acknowledged and dropped long ago. Ids are stable for the life of the agent's spool (the table
is journalled next to it), so a resent batch always means what it meant when it was encoded.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypedDict

from perfd.model import (
    CollectiveRecord,
    LabelSet,
    Provenance,
    RankScope,
    RankValue,
    Sample,
    StepRecord,
    StragglerLine,
    TimerValue,
    label_set,
)
from perfd.transport.gen import perfd_pb2 as pb

log = logging.getLogger(__name__)

SeriesKey = tuple[str, LabelSet]

# The sample columns' array type codes: uint32 ids, int64 times (epoch ns), float64 values.
U32 = next(c for c in "IL" if array(c).itemsize == 4)
I64, F64 = "q", "d"
_F64_BYTES = array(F64).itemsize
_SWAP = sys.byteorder != "little"  # the wire is little-endian
# The Batch fields that carry samples and their definitions, in both forms (the journal leaves
# them out: node samples are not state the analysis keeps).
SAMPLE_FIELDS = ("series", "series_ids", "timestamps_ns", "values", "series_ids_le", "timestamps_ns_le",
                 "values_le")

# StepRecord fields that are `optional` scalars on the wire: absent stays absent (None), never 0.
_OPT_FLOAT = ("end_time", "step_time_ms", "logged_tflops_per_gpu", "learning_rate", "lm_loss",
              "loss_scale", "grad_norm")
_OPT_INT = ("train_iters", "consumed_samples", "global_batch_size", "skipped_iterations",
            "nan_iterations", "interval")
_OPT_NAMES = _OPT_FLOAT + _OPT_INT
# CollectiveRecord fields that are `optional` scalars on the wire, by Python type.
_COLL_OPT_STR = ("raw_op", "pg_name", "pg_desc", "comm_id", "dtype", "state", "timing_source", "host")
_COLL_OPT_INT = ("rank", "pg_id", "group_rank", "group_size", "nnodes", "collective_seq_id", "p2p_seq_id",
                 "peer", "bytes", "time_created_ns", "time_completed_ns", "pid")
_COLL_OPT_FLOAT = ("duration_ms", "algbw_gbs", "busbw_gbs")


class Series(NamedTuple):
    """One series' definition: its name and its labels as sorted (name, value) pairs — the one
    form every layer keys on (a Series is a SeriesKey), made once when the definition is read."""

    name: str
    labels: LabelSet


class DecodedEvent(TypedDict):
    time_ns: int
    time: float  # epoch seconds, for convenience
    kind: str
    severity: str
    text: str
    labels: dict[str, str]
    job: str
    links: dict[str, str]
    payload: Any  # structured detail sent as JSON (None when the event had none)


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


class SeriesTable:
    """Agent side: (name, labels) → small integer id, stable for the life of the spool.

    With ``path`` the definitions are journalled (one JSON line per series, appended when the id
    is assigned, i.e. before any batch using it is spooled), so that after an agent restart the
    batches still in the spool decode to the same series. A torn last line is skipped and counted.
    """

    def __init__(self, path: Path | None = None) -> None:
        self._ids: dict[SeriesKey, int] = {}
        self._defs: list[Series] = []
        self._new: list[int] = []
        self._path = path
        self.journal_errors = 0  # lines that failed to load or to write
        if path is not None and path.exists():
            self._load(path)

    def __len__(self) -> int:
        return len(self._defs)

    def _load(self, path: Path) -> None:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    obj = json.loads(line)
                    sid, name = int(obj["id"]), str(obj["name"])
                    labels = label_set(dict(obj["labels"]))
                except (ValueError, KeyError, TypeError):
                    self.journal_errors += 1
                    continue
                if sid != len(self._defs):  # ids are dense and in order; anything else is damage
                    self.journal_errors += 1
                    continue
                self._defs.append(Series(name, labels))
                self._ids[(name, labels)] = sid
        if self.journal_errors:
            # Rewrite without the damaged lines: appending after a torn line would tear the next.
            try:
                path.write_text("".join(self._line(i) for i in range(len(self._defs))))
            except OSError:
                pass

    def _line(self, sid: int) -> str:
        s = self._defs[sid]
        return json.dumps({"id": sid, "name": s.name, "labels": dict(s.labels)}) + "\n"

    def _add(self, key: SeriesKey) -> int:
        sid = len(self._defs)
        series = Series(*key)
        self._ids[key] = sid
        self._defs.append(series)
        self._new.append(sid)
        if self._path is not None:
            try:
                with self._path.open("a", encoding="utf-8") as f:
                    f.write(self._line(sid))
            except OSError as e:  # a full disk must not stop sampling: counted, table kept in memory
                self.journal_errors += 1
                log.warning("series journal write failed (%s); ids stay valid until restart", e)
        return sid

    def id_for(self, name: str, labels: Mapping[str, str] | None = None) -> int:
        key: SeriesKey = (name, label_set(labels) if labels else ())
        sid = self._ids.get(key)
        return self._add(key) if sid is None else sid

    def series(self, sid: int) -> Series:
        return self._defs[sid]

    def take_new(self) -> list[int]:
        """Ids assigned since the previous call (their definitions go into the next batch)."""
        new, self._new = self._new, []
        return new

    def untake(self, ids: Iterable[int]) -> None:
        """Put ids back as new (their batch was not sent after all), ahead of later ones."""
        self._new[:0] = list(ids)

    def definitions(self, ids: Iterable[int] | None = None) -> list[pb.SeriesDef]:
        """Wire definitions of ``ids`` (default: every series, for a Hello)."""
        which = range(len(self._defs)) if ids is None else ids
        return [pb.SeriesDef(id=i, name=self._defs[i].name, labels=dict(self._defs[i].labels)) for i in which]

    def clear(self) -> None:
        """Forget every id (ids restart at 0). Only safe when no spooled batch references them."""
        self._ids.clear()
        self._defs.clear()
        self._new.clear()
        if self._path is not None:
            try:
                self._path.write_text("")
            except OSError:
                self.journal_errors += 1


# ------------------------------------------------------------------------------------ steps


def _set_present(src: Any, dst: Any, names: Iterable[str], conv: Callable[[Any], Any]) -> None:
    """Copy the fields of ``src`` that are not None onto the proto3 ``optional`` fields of ``dst``:
    an absent value stays unset (absent on the other side), never 0."""
    for name in names:
        v = getattr(src, name)
        if v is not None:
            setattr(dst, name, conv(v))


def step_to_pb(rec: StepRecord, m: pb.StepRecord) -> None:
    """Fill ``m`` (e.g. ``batch.steps.add()``) from ``rec``; None fields are left unset."""
    m.job = rec.job
    m.iteration = rec.iteration
    if isinstance(rec.rank, int):
        m.rank = rec.rank
    else:
        m.scope = rec.rank
    _set_present(rec, m, _OPT_FLOAT, float)
    _set_present(rec, m, _OPT_INT, int)
    m.fields.update(rec.fields)
    for tname, tv in rec.timers.items():
        t = m.timers[tname]
        if tv.min_ms is not None:
            t.min_ms = tv.min_ms
        if tv.max_ms is not None:
            t.max_ms = tv.max_ms
        t.per_rank.update(tv.per_rank)
    if rec.straggler is not None:
        s = m.straggler
        s.SetInParent()  # present even when it has no quantities
        if rec.straggler.time is not None:
            s.time = rec.straggler.time
        s.line_no = rec.straggler.line_no
        for qname, (lo, hi) in rec.straggler.quantities.items():
            q = s.quantities[qname]
            q.min.value, q.min.rank, q.min.unit = lo.value, lo.rank, lo.unit
            q.max.value, q.max.rank, q.max.unit = hi.value, hi.rank, hi.unit
    for rank, report in rec.memory_mb.items():
        m.memory_mb[rank].mb.update(report)
    if rec.source is not None:
        m.source.collector = rec.source.collector
        m.source.detail = rec.source.detail
        m.source.SetInParent()
    m.disturbed_by_capture = rec.disturbed_by_capture
    m.first_of_run = rec.first_of_run


_STEP_FD = pb.StepRecord.DESCRIPTOR.fields_by_name
_OPT_FD = {_STEP_FD[n]: n for n in _OPT_NAMES}  # descriptor -> StepRecord field name
(_FD_RANK, _FD_SCOPE, _FD_FIELDS, _FD_TIMERS, _FD_STRAGGLER, _FD_MEMORY, _FD_SOURCE, _FD_DISTURBED,
 _FD_FIRST) = (_STEP_FD[n] for n in ("rank", "scope", "fields", "timers", "straggler", "memory_mb", "source",
                                    "disturbed_by_capture", "first_of_run"))


def step_from_pb(m: pb.StepRecord) -> StepRecord:
    # What the record holds, in one call (a record sets a few of its 23 fields): every test below is
    # a dict lookup, not a call into the protobuf runtime — with the step hook every node sends a
    # record each second, and a HasField or accessor per field was most of this function.
    got: dict[Any, Any] = dict(m.ListFields())
    rank: RankScope
    if _FD_RANK in got:
        rank = got[_FD_RANK]
    elif _FD_SCOPE in got:
        if got[_FD_SCOPE] not in ("last", "all"):
            raise ValueError(f"step record with unknown rank scope {got[_FD_SCOPE]!r}")
        rank = "last" if got[_FD_SCOPE] == "last" else "all"
    else:
        rank = "last"  # the dataclass default; an encoder always sets one of the two
    opt: dict[str, Any] = {_OPT_FD[fd]: v for fd, v in got.items() if fd in _OPT_FD}
    straggler = None
    if _FD_STRAGGLER in got:
        s = got[_FD_STRAGGLER]
        straggler = StragglerLine(
            time=s.time if s.HasField("time") else None,
            quantities={k: (RankValue(q.min.value, q.min.rank, q.min.unit),
                            RankValue(q.max.value, q.max.rank, q.max.unit))
                        for k, q in s.quantities.items()},
            line_no=s.line_no,
        )
    source = got.get(_FD_SOURCE)
    return StepRecord(
        job=m.job,
        iteration=m.iteration,
        rank=rank,
        fields=dict(got[_FD_FIELDS]) if _FD_FIELDS in got else {},
        timers={k: TimerValue(min_ms=t.min_ms if t.HasField("min_ms") else None,
                              max_ms=t.max_ms if t.HasField("max_ms") else None,
                              per_rank=dict(t.per_rank))
                for k, t in got[_FD_TIMERS].items()} if _FD_TIMERS in got else {},
        straggler=straggler,
        memory_mb={r: dict(rep.mb) for r, rep in got[_FD_MEMORY].items()} if _FD_MEMORY in got else {},
        source=Provenance(source.collector, source.detail) if source is not None else None,
        disturbed_by_capture=_FD_DISTURBED in got,
        first_of_run=_FD_FIRST in got,
        **opt,
    )


# ------------------------------------------------------------------------------------ events


def event_to_pb(ev: Mapping[str, Any], m: pb.Event) -> None:
    """Events are plain mappings: time_ns (or time, epoch s), kind, severity, text, labels, job, links."""
    if "time_ns" in ev:
        m.time_ns = int(ev["time_ns"])
    elif ev.get("time") is not None:
        m.time_ns = round(float(ev["time"]) * 1e9)
    else:
        m.time_ns = time.time_ns()
    m.kind = str(ev.get("kind", ""))
    m.severity = str(ev.get("severity", "info"))
    m.text = str(ev.get("text", ""))
    m.job = str(ev.get("job", ""))
    m.labels.update({str(k): str(v) for k, v in (ev.get("labels") or {}).items()})
    m.links.update({str(k): str(v) for k, v in (ev.get("links") or {}).items()})
    if ev.get("payload") is not None:
        # JSON, not a nested message: payloads differ by event kind and are read by few consumers.
        m.payload_json = json.dumps(ev["payload"], separators=(",", ":"), default=str)


def event_from_pb(m: pb.Event) -> DecodedEvent:
    payload: Any = None
    if m.payload_json:
        try:
            payload = json.loads(m.payload_json)
        except ValueError:  # a bad payload loses the detail, not the event
            payload = {"unparsed": m.payload_json[:1000]}
    return DecodedEvent(time_ns=m.time_ns, time=m.time_ns / 1e9, kind=m.kind, severity=m.severity,
                        text=m.text, labels=dict(m.labels), job=m.job, links=dict(m.links),
                        payload=payload)


# ------------------------------------------------------------------------------------ collectives


def collective_to_pb(rec: CollectiveRecord, m: pb.CollectiveRecord,
                     rank_lists: dict[tuple[int, ...], int], batch: pb.Batch) -> None:
    """Fill ``m`` from ``rec``; None fields are left unset. ``pg_ranks`` goes into the batch's
    ``rank_lists`` once per distinct list (``rank_lists`` maps a list to its index)."""
    m.job, m.source, m.op, m.is_p2p = rec.job, rec.source, rec.op, rec.is_p2p
    _set_present(rec, m, _COLL_OPT_STR, str)
    _set_present(rec, m, _COLL_OPT_INT, int)
    _set_present(rec, m, _COLL_OPT_FLOAT, float)
    if rec.pg_ranks is not None:
        key = tuple(rec.pg_ranks)
        idx = rank_lists.get(key)
        if idx is None:
            idx = rank_lists[key] = len(batch.rank_lists)
            batch.rank_lists.add().ranks.extend(key)
        m.pg_ranks_index = idx
    if rec.provenance is not None:
        m.provenance.collector = rec.provenance.collector
        m.provenance.detail = rec.provenance.detail
        m.provenance.SetInParent()


def collective_from_pb(m: pb.CollectiveRecord, rank_lists: Sequence[list[int]],
                       provenances: dict[tuple[str, str], Provenance] | None = None) -> CollectiveRecord:
    """Decode one record; raises ValueError for a rank-list index outside the batch's table.

    Records of one batch that name the same rank list share one list object (a 512-rank group on
    10,000 records would otherwise be copied 10,000 times): treat ``pg_ranks`` as read-only.
    ``provenances`` (optional) shares one Provenance object between records that name the same."""
    opt: dict[str, Any] = {}
    for name in _COLL_OPT_STR + _COLL_OPT_INT + _COLL_OPT_FLOAT:
        opt[name] = getattr(m, name) if m.HasField(name) else None
    pg_ranks = None
    if m.HasField("pg_ranks_index"):
        if m.pg_ranks_index >= len(rank_lists):
            raise ValueError(f"collective record names rank list {m.pg_ranks_index}; "
                             f"the batch has {len(rank_lists)}")
        pg_ranks = rank_lists[m.pg_ranks_index]  # shared by the batch's records: never mutate
    prov = None
    if m.HasField("provenance"):
        key = (m.provenance.collector, m.provenance.detail)
        prov = provenances.get(key) if provenances is not None else None
        if prov is None:
            prov = Provenance(*key)
            if provenances is not None:
                provenances[key] = prov
    return CollectiveRecord(job=m.job, source=m.source, op=m.op, is_p2p=m.is_p2p, pg_ranks=pg_ranks,
                            provenance=prov, **opt)


# ------------------------------------------------------------------------------------ batches


def encode_batch(
    agent_id: str,
    seq: int,
    samples: Iterable[Sample],
    steps: Iterable[StepRecord],
    events: Iterable[Mapping[str, Any]],
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
        b.series_ids_le, b.timestamps_ns_le, b.values_le = (_le_bytes(c) for c in (ids, ts, vals))
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


def _le_bytes(col: array[Any]) -> bytes:
    if _SWAP:
        col = array(col.typecode, col)
        col.byteswap()
    return col.tobytes()


def _le_array(code: str, raw: bytes, what: str) -> array[Any]:
    col = array(code)
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
        cols = (_le_array(U32, raw[0], "series_ids_le"), _le_array(I64, raw[1], "timestamps_ns_le"),
                _le_array(F64, raw[2], "values_le"))
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
