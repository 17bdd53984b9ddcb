"""The ingest side of the aggregator's state: what the transport (perfd.aggregator.daemon), the engine's
root (perfd.aggregator.engine_sink) and the durable replay (perfd.aggregator.durable) call, writing
the parts it is built with (the job store, the node view, the collective and serving stores, the event
log, the incident tracker, the rank hosts).

Every public method but :meth:`StateIngest.held_fold` is a write (perfd.aggregator.state_changes):
the state's change count moves after it, and a job's snapshot is built anew when next read.
Called from the gRPC event loop (and the replay before it runs); each part has its own lock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from perfd.aggregator.collectives import CollectiveStore
from perfd.aggregator.eventlog import EventLog
from perfd.aggregator.hosts import HostView
from perfd.aggregator.incidents import IncidentTracker
from perfd.aggregator.jobs import JobStore, StepConflicts
from perfd.aggregator.nodes import NodeView
from perfd.aggregator.serving import ServingStore
from perfd.aggregator.state_changes import Changes, writes
from perfd.core.clock import REAL_CLOCK, Clock
from perfd.core.collfold import CollectivePartial
from perfd.core.events import (
    GPU_PODS,
    GPU_PROCESSES,
    JOB_PHASE,
    NCCL_HANG,
    RANK_PROCESSES,
    RANK_STACKS,
    SERVING_DATA,
    STEP_CONFLICT,
)
from perfd.core.limits import REFUSAL_LOG_INTERVAL_S
from perfd.core.model import CollectiveRecord, JobInfo, StepRecord
from perfd.core.winfigures import WindowFigures
from perfd.transport.series import SeriesKey

MAX_CONFLICT_KEYS = 10_000  # (job, holder, sender) whose last conflict event is remembered


class JobHolder(Protocol):
    """A part that holds something of a job beside the ingest side's own (the analysis pass, the
    snapshots, the stall watch, the placements): it lets the job go when the job is forgotten."""

    def forget(self, job: str) -> None: ...


class StateIngest:
    def __init__(self, changes: Changes, jobs: JobStore, nodes: NodeView, collectives: CollectiveStore,
                 log: EventLog, serving: ServingStore, incidents: IncidentTracker, hosts: HostView,
                 holders: Sequence[JobHolder] = (), clock: Clock = REAL_CLOCK) -> None:
        """``holders``: the other parts that hold something of a job (:meth:`forget_job`)."""
        self.clock = clock
        self.changes = changes
        self.jobs = jobs
        self.nodes = nodes
        self.collectives = collectives
        self.log = log
        self.serving = serving
        self.incidents = incidents
        self.hosts = hosts
        self.holders = tuple(holders)
        self.replaying = False  # the state store's replay: its events come back with the documents
        # (job, holder, sender) -> (when its conflict event was last emitted, records since)
        self._conflicts: dict[tuple[str, str, str], tuple[float, int]] = {}
        self.log.handle(GPU_PROCESSES, self.nodes.on_gpu_processes)
        self.log.handle(GPU_PODS, self.nodes.on_gpu_pods)
        self.log.handle(NCCL_HANG, self._on_hang)
        self.log.handle(SERVING_DATA, self._on_serving_data)
        self.log.handle(RANK_PROCESSES, self.hosts.on_rank_processes)
        self.log.handle(JOB_PHASE, self.hosts.on_job_phase)
        self.log.handle(RANK_STACKS, self.hosts.on_rank_stacks)

    # ---- the transport's ---------------------------------------------------------------------------
    @writes
    def hello(self, agent_id: str, jobs: Sequence[str], now: float | None = None, node: str | None = None,
              capabilities: Mapping[str, str] | None = None) -> None:
        self.nodes.seen(agent_id)
        if node is not None:  # a live Hello (a replayed one holds only its jobs)
            self.nodes.said_hello(agent_id, node, capabilities or {})
        self.jobs.hello(agent_id, jobs, now)

    @writes
    def series_defined(self, agent_id: str, series_ids: Sequence[int]) -> None:
        """A stream of the agent (re)defined these series ids (before samples that use them)."""
        self.nodes.defined(agent_id, series_ids)

    @writes
    def ingest_samples(self, agent_id: str, series_defs: Mapping[int, SeriesKey],
                       series_ids: Sequence[int], timestamps_ns: Sequence[int],
                       values: Sequence[float]) -> None:
        self.nodes.ingest_samples(agent_id, series_defs, series_ids, timestamps_ns, values,
                                  lambda model: self._note_gpu_model(agent_id, model))

    def _note_gpu_model(self, agent_id: str, model: str) -> None:
        """The GPU model an agent's series name: its own job's (a sidecar with NVML), and that of
        each job placed on its GPUs (a node agent's: the peak table of their MFU needs it)."""
        self.jobs.note_gpu_model(agent_id, model)
        for job in self.nodes.jobs_on(agent_id):
            self.jobs.set_gpu_model(job, model)

    @writes
    def ingest_job_info(self, agent_id: str, job: str, info: JobInfo, now: float | None = None) -> None:
        self.jobs.ingest_job_info(agent_id, job, info, now)

    @writes
    def ingest_steps(self, agent_id: str, steps: Sequence[StepRecord], now: float | None = None
                     ) -> StepConflicts:
        """Hold the records; those of another agent for an (iteration, rank) already held are kept
        out, and an event names both agents (at most one per job, holder and sender every
        REFUSAL_LOG_INTERVAL_S: a flood of conflicting records must not push real events out of
        the bounded log). Returns what was kept out, for the caller to count."""
        out = self.jobs.ingest_steps(agent_id, steps, now)
        for job in {r.job for r in steps}:  # its processes as observed until now: while it stepped
            self.hosts.stepped(job, now)
        for job, runs in out.ended_runs.items():  # a run ended: its incidents end with it
            for run in runs:
                self.incidents.retire_run(job, run, self.clock.time() if now is None else now)
        if not (out.other_agent or out.displaced) or self.replaying:
            return out
        evs = self._conflict_events(agent_id, out, self.clock.time())
        if evs:
            self.ingest_events("aggregator", evs)
        return out

    def _conflict_events(self, agent_id: str, out: StepConflicts, now: float) -> list[dict[str, Any]]:
        evs = []
        for (job, ahead), its in out.displaced.items():  # rare: once per squatted stretch reached
            evs.append({"kind": STEP_CONFLICT.name, "severity": "warning", "job": job, "time": now,
                        "text": f"{len(its)} step record(s) of job {job[:80]} held from agent {ahead[:80]} "
                                f"were written ahead of the job (e.g. iteration {its[0]}): replaced by agent "
                                f"{agent_id[:80]}'s, which continues it",
                        "labels": {"holder": ahead, "sender": agent_id},
                        "payload": {"job": job, "holder": ahead, "sender": agent_id, "records": len(its),
                                    "iterations": sorted(set(its))[:20], "outcome": "replaced"}})
        for (job, holder), its in out.other_agent.items():
            key = (job, holder, agent_id)
            pending = self._conflicts.get(key)
            n = len(its) + (pending[1] if pending is not None else 0)
            if pending is not None and now - pending[0] < REFUSAL_LOG_INTERVAL_S:
                self._conflicts[key] = (pending[0], n)
                continue
            self._conflicts[key] = (now, 0)
            evs.append({"kind": STEP_CONFLICT.name, "severity": "warning", "job": job, "time": now,
                        "text": f"{n} step record(s) of job {job[:80]} from agent {agent_id[:80]} for "
                                f"iterations already held from agent {holder[:80]} (e.g. {its[0]}): "
                                f"refused, the held records kept",
                        "labels": {"holder": holder, "sender": agent_id},
                        "payload": {"job": job, "holder": holder, "sender": agent_id, "records": n,
                                    "iterations": sorted(set(its))[:20]}})
        if len(self._conflicts) > MAX_CONFLICT_KEYS:  # senders and jobs come from the network: bounded
            self._conflicts = {k: v for k, v in self._conflicts.items()
                               if now - v[0] < REFUSAL_LOG_INTERVAL_S}
        return evs

    @writes
    def ingest_collectives(self, agent_id: str, recs: Sequence[CollectiveRecord]) -> None:
        self.nodes.seen(agent_id)
        for job in {r.job for r in recs}:
            self.jobs.add_agent(job, agent_id)
        self.collectives.ingest(agent_id, recs)

    @writes
    def ingest_events(self, agent_id: str, evs: Sequence[Mapping[str, object]]) -> None:
        """Into the event log, which routes each kind to its part (process lists, rank hosts, serving
        records, hangs: what a snapshot shows) and hands every event to its listeners."""
        self.log.ingest(agent_id, evs)

    def _on_hang(self, agent_id: str, ev: Mapping[str, object]) -> bool:
        self.collectives.add_hang_event(agent_id, ev)  # merged across agents by the analysis
        return True

    def _on_serving_data(self, agent_id: str, ev: Mapping[str, object]) -> bool:
        """SGLang records for the job's serving analysis (state: the window, not history)."""
        job = self.serving.ingest(ev.get("payload"))
        if job is None:
            return False  # refused and counted by the serving store
        self.jobs.add_agent(job, agent_id)
        return True

    # ---- the engine's root (perfd.engine): a job's records as its nodes folded them ------------------
    @writes
    def note_folded_ranks(self, job: str, ranks: Collection[int]) -> None:
        self.jobs.note_folded_ranks(job, ranks)

    def held_fold(self, job: str, iteration: int) -> StepRecord | None:
        """The ``"all"`` record held for the job's iteration (the root folds a late node's into it)."""
        return self.jobs.held_fold(job, iteration)

    @writes
    def ingest_collective_partial(self, agent_id: str, partial: CollectivePartial,
                                  folded: bool = False) -> None:
        """A node's collective records as its agent reduced them (the engine path); ``folded``: their
        windows are folded at the shards, whose figures come through :meth:`ingest_window_figures`."""
        self.nodes.seen(agent_id)
        self.jobs.add_agent(partial.job, agent_id)
        self.collectives.ingest_partial(agent_id, partial, folded)

    @writes
    def ingest_window_figures(self, figs: WindowFigures) -> None:
        """Per-window figures a shard's fold made of its ranks' operations (the engine path)."""
        self.collectives.ingest_figures(figs)

    # ---- what the API, the durable replay and the lifecycle write -------------------------------------
    @writes
    def set_new_normal(self, job: str, iteration: int | None) -> int | None:
        """The job's lasting shift is its new normal from ``iteration`` (perfd.aggregator.jobs)."""
        return self.jobs.set_new_normal(job, iteration)

    @writes
    def set_gpu_model(self, job: str, model: str) -> None:
        """The model of the job's GPUs the state store kept (the samples that named it are not kept)."""
        self.jobs.set_gpu_model(job, model)

    @writes
    def load_incidents(self, doc: Mapping[str, object]) -> None:
        """The incidents the state store kept, back at start."""
        self.incidents.load(doc)

    @writes
    def restore_events(self, evs: Sequence[Mapping[str, object]]) -> None:
        """The aggregator's own events the state store kept, back into the event log."""
        self.log.restore(evs)

    @writes
    def forget_job(self, job: str) -> None:
        """Drop everything held of the job (perfd.aggregator.retention prunes it)."""
        self.jobs.forget(job)
        self.collectives.forget(job)
        self.serving.forget(job)
        self.incidents.forget(job)
        self.hosts.forget(job)
        for holder in self.holders:
            holder.forget(job)
        self._conflicts = {k: v for k, v in self._conflicts.items() if k[0] != job}

    @writes
    def forget_agent(self, agent_id: str) -> None:
        """Drop what the agent sent that is not a job's (its node series, process lists)."""
        self.nodes.forget_agent(agent_id)
        self.jobs.forget_agent(agent_id)
        self.hosts.forget_agent(agent_id)
