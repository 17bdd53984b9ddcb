"""Per-record-kind conversions between perfd.core.model records and their wire messages: step
records, events and collective records, each filled into (or read from) its message in a Batch.

Apart from the batch codec (perfd.transport.codec), which frames these records with the columnar
samples, because each kind has its own rules (``optional`` scalars that stay absent, rank lists
shared across a batch) and its own hot path.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, SupportsFloat, SupportsInt, TypedDict

from perfd.core.model import (
    CollectiveRecord,
    Provenance,
    RankScope,
    RankValue,
    StepRecord,
    StragglerLine,
    TimerValue,
)
from perfd.core.typed import JSON
from perfd.transport.gen import perfd_pb2 as pb

# StepRecord fields that are `optional` scalars on the wire: absent stays absent (None), never 0.
_OPT_FLOAT = ("end_time", "step_time_ms", "logged_tflops_per_gpu", "learning_rate", "lm_loss",
              "loss_scale", "grad_norm", "tokens_per_step", "flops_per_step")
_OPT_INT = ("train_iters", "consumed_samples", "global_batch_size", "skipped_iterations",
            "nan_iterations", "interval")
_OPT_NAMES = _OPT_FLOAT + _OPT_INT
# CollectiveRecord fields that are `optional` scalars on the wire, by Python type.
_COLL_OPT_STR = ("raw_op", "pg_name", "pg_desc", "comm_id", "dtype", "state", "timing_source", "host")
_COLL_OPT_INT = ("rank", "pg_id", "group_rank", "group_size", "nnodes", "collective_seq_id", "p2p_seq_id",
                 "peer", "bytes", "time_created_ns", "time_completed_ns", "pid")
_COLL_OPT_FLOAT = ("duration_ms", "algbw_gbs", "busbw_gbs")


class DecodedEvent(TypedDict):
    time_ns: int
    time: float  # epoch seconds, for convenience
    kind: str
    severity: str
    text: str
    labels: dict[str, str]
    job: str
    links: dict[str, str]
    payload: JSON  # structured detail sent as JSON (None when the event had none)


# ------------------------------------------------------------------------------------ steps


def _set_present(src: StepRecord | CollectiveRecord, dst: pb.StepRecord | pb.CollectiveRecord,
                 names: Iterable[str], conv: Callable[[str | float], object]) -> None:
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
    m.armed = rec.armed
    m.rank_end_times.update(rec.rank_end_times)


_STEP_FD = pb.StepRecord.DESCRIPTOR.fields_by_name
_OPT_FD = {_STEP_FD[n]: n for n in _OPT_NAMES}  # descriptor -> StepRecord field name
(_FD_RANK, _FD_SCOPE, _FD_FIELDS, _FD_TIMERS, _FD_STRAGGLER, _FD_MEMORY, _FD_SOURCE, _FD_DISTURBED,
 _FD_FIRST, _FD_ARMED, _FD_ENDS) = (_STEP_FD[n] for n in ("rank", "scope", "fields", "timers", "straggler",
                                                         "memory_mb", "source", "disturbed_by_capture",
                                                         "first_of_run", "armed", "rank_end_times"))


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
    fields: dict[str, str] = dict(got[_FD_FIELDS]) if _FD_FIELDS in got else {}
    if fields and source is not None and source.collector == "hook":
        _legacy_hook_counts(fields, opt)
    return StepRecord(
        job=m.job,
        iteration=m.iteration,
        rank=rank,
        fields=fields,
        timers={k: TimerValue(min_ms=t.min_ms if t.HasField("min_ms") else None,
                              max_ms=t.max_ms if t.HasField("max_ms") else None,
                              per_rank=dict(t.per_rank))
                for k, t in got[_FD_TIMERS].items()} if _FD_TIMERS in got else {},
        straggler=straggler,
        memory_mb={r: dict(rep.mb) for r, rep in got[_FD_MEMORY].items()} if _FD_MEMORY in got else {},
        source=Provenance(source.collector, source.detail) if source is not None else None,
        disturbed_by_capture=_FD_DISTURBED in got,
        first_of_run=_FD_FIRST in got,
        armed=_FD_ARMED in got,
        rank_end_times=dict(got[_FD_ENDS]) if _FD_ENDS in got else {},
        **opt,
    )


# The step hook's counts that an agent older than their typed fields sent as text in ``fields``.
_LEGACY_HOOK_COUNTS = ("tokens_per_step", "flops_per_step")


def _legacy_hook_counts(fields: Mapping[str, str], opt: dict[str, object]) -> None:
    """Read the hook's per-step counts an older agent wrote as text (``f"{x:.10g}"``) into ``opt``,
    where the typed value is absent: a positive finite number, else left absent."""
    for name in _LEGACY_HOOK_COUNTS:
        text = fields.get(name)
        if text is None or name in opt:
            continue
        try:
            x = float(text)
        except ValueError:
            continue
        if math.isfinite(x) and x > 0:
            opt[name] = x


# ------------------------------------------------------------------------------------ events


def _int(v: object, what: str) -> int:
    if isinstance(v, SupportsInt | str | bytes):
        return int(v)
    raise TypeError(f"event {what} {v!r}: not a number")


def _float(v: object, what: str) -> float:
    if isinstance(v, SupportsFloat | str | bytes):
        return float(v)
    raise TypeError(f"event {what} {v!r}: not a number")


def _strings(v: object, what: str) -> dict[str, str]:
    """A mapping field (labels, links) as strings; absent or empty: none."""
    if not v:
        return {}
    if not isinstance(v, Mapping):
        raise TypeError(f"event {what}: {type(v).__name__}, not a mapping")
    return {str(k): str(x) for k, x in v.items()}


def event_to_pb(ev: Mapping[str, object], m: pb.Event) -> None:
    """Events are plain mappings: time_ns (or time, epoch s), kind, severity, text, labels, job, links."""
    if "time_ns" in ev:
        m.time_ns = _int(ev["time_ns"], "time_ns")
    elif ev.get("time") is not None:
        m.time_ns = round(_float(ev["time"], "time") * 1e9)
    else:
        m.time_ns = time.time_ns()
    m.kind = str(ev.get("kind", ""))
    m.severity = str(ev.get("severity", "info"))
    m.text = str(ev.get("text", ""))
    m.job = str(ev.get("job", ""))
    m.labels.update(_strings(ev.get("labels"), "labels"))
    m.links.update(_strings(ev.get("links"), "links"))
    if ev.get("payload") is not None:
        # JSON, not a nested message: payloads differ by event kind and are read by few consumers.
        m.payload_json = json.dumps(ev["payload"], separators=(",", ":"), default=str)


def event_from_pb(m: pb.Event) -> DecodedEvent:
    payload: JSON = None
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

