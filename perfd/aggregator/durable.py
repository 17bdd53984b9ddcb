"""Wiring of the aggregator to its state store (``--state-dir``): what is written, when, and how
it is read back at start. The store itself (SQLite, what "durable" means) is perfd.aggregator.state_store.

Agent data goes through the ingest server's journal hooks (:class:`Journal`): a Hello's job list,
each accepted batch without its samples, the dedupe seq — committed before each Ack. The
aggregator's own state (capture records, rule states and capture budgets, incidents, the events it
emitted) is written as documents by the rules loop (:func:`save_documents`, every rules interval),
so a kill -9 loses at most one interval of it; it never re-emits an incident it had already
reported, because the incident record comes back with it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
from collections import deque
from collections.abc import Sequence
from typing import Any

from perfd.aggregator.state_schema import BATCH, HELLO, StoreError
from perfd.aggregator.state_store import StateStore
from perfd.aggregator.wiring import AggregatorParts
from perfd.core import limits as L
from perfd.transport.codec import SAMPLE_FIELDS, DecodedBatch
from perfd.transport.delivery import Kept
from perfd.transport.gen import perfd_pb2 as pb

log = logging.getLogger(__name__)

AGGREGATOR_AGENT = "aggregator"  # the agent id the aggregator's own events carry


class Journal:
    """perfd.transport.delivery.IngestJournal over a :class:`StateStore`. ``max_hello_jobs``: the
    jobs of a Hello kept (the guard admits no more per agent: perfd.core.limits.MAX_JOBS_PER_AGENT)."""

    def __init__(self, store: StateStore, max_hello_jobs: int = L.MAX_JOBS_PER_AGENT) -> None:
        self.store = store
        self.max_hello_jobs = max_hello_jobs

    def hello(self, agent_id: str, jobs: Sequence[str]) -> None:
        """The jobs the guard admitted of the agent's Hello (never the names it refused: a Hello of
        100 names of 100 KB each was once stored whole)."""
        self.store.journal(HELLO, agent_id, json.dumps(list(jobs[:self.max_hello_jobs])).encode())

    def batch(self, agent_id: str, batch: pb.Batch, kept: Kept | None = None) -> None:
        """What the aggregator kept of the batch, without its samples (nothing it refused)."""
        if not (batch.steps or batch.events or batch.job_info_json or batch.collectives):
            return  # samples only: nothing the analysis keeps
        out = pb.Batch()
        out.CopyFrom(batch)
        for name in SAMPLE_FIELDS:
            out.ClearField(name)
        if kept is not None:
            for i, payload_json in (kept.payloads or {}).items():
                if 0 <= i < len(out.events):
                    out.events[i].payload_json = payload_json
            _keep(out.steps, kept.steps)
            _keep(out.events, kept.events)
            _keep(out.collectives, kept.collectives)
            if kept.job_info is not None:
                for job in [j for j in out.job_info_json if j not in kept.job_info]:
                    del out.job_info_json[job]
        if not (out.steps or out.events or out.job_info_json or out.collectives):
            return  # all of it refused
        self.store.journal(BATCH, agent_id, out.SerializeToString(), only_job(out))
        for job, text in out.job_info_json.items():
            self.store.put_job_info(job, agent_id, text)

    def seq(self, agent_id: str, epoch: str, seq: int) -> None:
        self.store.put_seq(agent_id, epoch, seq)

    def commit(self) -> bool:
        return self.store.commit()

    def lost(self, agent_id: str) -> bool:
        return self.store.lost(agent_id)

    def recover(self, agent_id: str) -> tuple[str, int] | None:
        return self.store.recover(agent_id)


def _keep(field: Any, indices: Sequence[int] | None) -> None:
    """Keep only ``indices`` of a repeated message field (None: all)."""
    if indices is None or len(indices) == len(field):
        return
    items = [field[i] for i in indices if 0 <= i < len(field)]
    copies = []
    for m in items:
        c = type(m)()
        c.CopyFrom(m)
        copies.append(c)
    del field[:]
    field.extend(copies)


def only_job(batch: pb.Batch) -> str | None:
    """The one job a batch's data names (its row goes when that job is pruned), None: several or none."""
    jobs = {r.job for r in batch.steps} | set(batch.job_info_json) | {c.job for c in batch.collectives}
    jobs |= {e.job for e in batch.events if e.job}
    return next(iter(jobs)) if len(jobs) == 1 else None


def _without(batch: DecodedBatch, gone: set[str]) -> DecodedBatch:
    """The batch without what it holds of the pruned jobs ``gone`` (its row named other jobs too)."""
    return dataclasses.replace(
        batch, steps=[r for r in batch.steps if r.job not in gone],
        job_info_json={j: t for j, t in batch.job_info_json.items() if j not in gone},
        collectives=[c for c in batch.collectives if c.job not in gone],
        events=[e for e in batch.events if e.get("job") not in gone])


def restore(agg: AggregatorParts, store: StateStore) -> dict[str, int]:
    """Read everything back into a fresh aggregator, before it listens. Returns what was read;
    StoreError (one clear line, exit 2) when the file cannot be read through."""
    try:
        return _restore(agg, store)
    except sqlite3.Error as exc:  # damage quick_check at open did not see: say so, no traceback
        raise StoreError(f"{store.path} cannot be read back ({exc}): move it away to start with an "
                         "empty state, or put back a good copy") from exc


def _restore(agg: AggregatorParts, store: StateStore) -> dict[str, int]:
    counts = {"hellos": 0, "batches": 0, "job_infos": 0, "unreadable": 0}
    agg.state.replaying = agg.guard.replaying = True
    try:
        _replay(agg, store, counts)
    finally:
        agg.state.replaying = agg.guard.replaying = False
    for job, agent, text in store.job_infos():  # the newest job info wins whatever was pruned
        agg.ingest_job_info_text(agent, job, text)
        counts["job_infos"] += 1
    agg.server.seq_state = type(agg.server.seq_state).load(store.seqs())
    _restore_documents(agg, store, counts)
    return counts


def _replay(agg: AggregatorParts, store: StateStore, counts: dict[str, int]) -> None:
    from perfd.transport.codec import decode_batch

    # A Hello holds a job only while its stream is open, and none is at a restart: of the jobs it
    # names, only those with data come back (their hosts matter); the others would be released at
    # once (perfd.aggregator.retention) and could only take room at the cap meanwhile.
    with_data = store.journal_jobs()
    # Pruned jobs whose tombstone is younger than the row being replayed: the rows come in arrival
    # order, so the set only shrinks as the replay goes on.
    tombs = sorted((when, job) for job, when in store.tombstones().items())
    gone, k = {job for _, job in tombs}, 0
    for t, kind, agent, body in store.replay_timed():
        try:
            # Replayed at the time each row first arrived: a job that ended a day before the restart
            # is a day old again, not one that stepped a moment ago (perfd.aggregator.retention).
            if kind == HELLO:
                agg.on_hello_jobs(agent, [str(j) for j in json.loads(body) if str(j) in with_data], float(t))
                counts["hellos"] += 1
            elif kind == BATCH:
                batch = decode_batch(pb.Batch.FromString(body), {})
                while k < len(tombs) and tombs[k][0] < float(t):
                    gone.discard(tombs[k][1])
                    k += 1
                agg.on_batch(agent, _without(batch, gone) if gone else batch, float(t))
                counts["batches"] += 1
        except Exception as exc:  # one bad row must not keep the aggregator down
            counts["unreadable"] += 1
            log.warning("state store: a %s row of agent %s could not be replayed: %s", kind, agent, exc)


def save_documents(agg: AggregatorParts, store: StateStore) -> None:
    """The aggregator's own state, as JSON documents (called by the rules loop)."""
    cap = agg.captures
    store.put_doc("captures", cap.list())
    eng = cap.engine
    if eng is not None:
        store.put_doc("rules", {
            "states": [{"rule": s.rule, "key": s.key, "pending_since": s.pending_since,
                        "firing_since": s.firing_since} for s in eng.states()],
            "budgets": [{"rule": k[0], "job": k[1], "times": list(b.times)}
                        for k, b in eng.budgets().items()]})
    store.put_doc("incidents", agg.state.incidents_doc())
    store.put_doc("new_normal", agg.state.new_normals())
    store.put_doc("gpu_models", agg.state.gpu_models())
    store.put_doc("events", [e for e in agg.state.recent_events(limit=10_000)
                             if e.get("agent") == AGGREGATOR_AGENT])


def _key(k: Any) -> Any:
    return tuple(k) if isinstance(k, list) else k  # JSON turned tuple keys into lists


def _restore_documents(agg: AggregatorParts, store: StateStore, counts: dict[str, int]) -> None:
    from perfd.aggregator.capture_records import CaptureRecord

    caps: list[CaptureRecord] = []
    for d in store.get_doc("captures") or []:
        try:
            caps.append(CaptureRecord.from_json(d))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # another version's, or damage
            counts["unreadable"] += 1
            log.warning("state store: a capture record left out, unreadable (%s: %s)", type(exc).__name__,
                        str(exc)[:200])
    agg.state.capture_book.restore(caps)
    rules = store.get_doc("rules")
    eng = agg.captures.engine
    if rules and eng is not None:
        eng.restore([(s["rule"], _key(s["key"]), float(s["pending_since"]),
                      None if s["firing_since"] is None else float(s["firing_since"]))
                     for s in rules.get("states", [])],
                    {(b["rule"], b["job"]): deque(float(t) for t in b["times"])
                     for b in rules.get("budgets", [])})
    inc = store.get_doc("incidents")
    if inc:
        agg.state.load_incidents(inc)
    for job, it in (store.get_doc("new_normal") or {}).items():
        if isinstance(it, int):  # a job pruned since is not held: nothing to set
            agg.state.set_new_normal(str(job), it)
    models = store.get_doc("gpu_models")
    for job, model in (models.items() if isinstance(models, dict) else ()):
        # before the first analysis digests the runs the replay closed (their MFU needs the peak);
        # only jobs the replay brought back, a name of bounded size
        if isinstance(model, str) and 0 < len(model) <= 256:
            agg.state.set_gpu_model(str(job), model)
    evs = store.get_doc("events") or []
    if evs:
        agg.state.restore_events(evs)
