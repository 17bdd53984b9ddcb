"""What the jobs' root on the distributed path (perfd.engine.root) hands the aggregator: the folded
iterations and job info, which go to the state as one agent's (``ENGINE_AGENT``), and the nodes'
events and collective records (reduced, perfd.core.collfold, or as sent by an older
agent), which go to it as the agent's that sent each.

The engine's credentials are the boundary on this path: an agent id in a records message is taken as
sent, where a stream to an aggregator is held to the hosts its Hello named (perfd.aggregator.guard).
What the guard checks of the content still applies: an event that is not of its kind's declared type
is refused and counted (``malformed_event``), as from a stream; and the jobs cap: a job the engine
brings is held by ``ENGINE_AGENT`` (its collectives by their agent), refused and counted past the cap
(``jobs_cap``, ``jobs_quota``: the engine is one agent to the quota, --max-jobs-per-agent), ended
jobs pruned to make room as for any other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from perfd.aggregator.guard import Guard
from perfd.aggregator.jobs import StepConflicts
from perfd.core.collfold import CollectivePartial
from perfd.core.model import CollectiveRecord, JobInfo, StepRecord
from perfd.core.winfigures import WindowFigures


class StateSink(Protocol):
    """What the root's records go to: the ingest side of the aggregator's state
    (perfd.aggregator.state_ingest; perfd.aggregator.state.AggregatorState gives it)."""

    def ingest_steps(self, agent_id: str, steps: Sequence[StepRecord], now: float | None = None
                     ) -> StepConflicts: ...

    def ingest_job_info(self, agent_id: str, job: str, info: JobInfo, now: float | None = None) -> None: ...

    def note_folded_ranks(self, job: str, ranks: Collection[int]) -> None: ...

    def held_fold(self, job: str, iteration: int) -> StepRecord | None: ...

    def ingest_collectives(self, agent_id: str, recs: Sequence[CollectiveRecord]) -> None: ...

    def ingest_events(self, agent_id: str, evs: Sequence[Mapping[str, object]]) -> None: ...

    def ingest_collective_partial(self, agent_id: str, partial: CollectivePartial,
                                  folded: bool = False) -> None: ...

    def ingest_window_figures(self, figs: WindowFigures) -> None: ...

    def forget_job(self, job: str) -> None: ...

    def job_names(self) -> list[str]: ...


class EngineSink:
    """perfd.engine.root.RootSink over the aggregator's state and guard; ``prune``: the aggregator's
    own pruning of a job (perfd.aggregator.retention.Lifecycle.prune: its state, journal, captures)."""

    def __init__(self, state: StateSink, guard: Guard,
                 prune: Callable[[str, str], None] | None = None) -> None:
        self.state, self.guard, self.prune = state, guard, prune

    def let_go(self, tokens: Collection[str]) -> list[str]:
        """The jobs of ``tokens`` (perfd.engine.subjects.job_token) pruned: a root of their own leads
        them, and the copy here would stand still while they run (a stalled job to the rules)."""
        from perfd.engine.subjects import job_token

        jobs = sorted(j for j in {*self.guard.held_jobs(), *self.state.job_names()} if job_token(j) in tokens)
        for job in jobs:
            if self.prune is not None:
                self.prune(job, "a root of its own leads it (perfd aggregator --engine-job)")
            else:
                self.state.forget_job(job)
                self.guard.forget_job(job)
        return jobs

    def ingest_steps(self, agent_id: str, steps: Sequence[StepRecord], now: float | None = None) -> object:
        self.guard.bounded(agent_id, steps)  # the values as a batch's are (perfd.core.bounds)
        return self.state.ingest_steps(agent_id, steps, now)

    def ingest_job_info(self, agent_id: str, job: str, info: JobInfo, now: float | None = None) -> None:
        self.state.ingest_job_info(agent_id, job, info, now)

    def note_folded_ranks(self, job: str, ranks: Collection[int]) -> None:
        self.state.note_folded_ranks(job, ranks)

    def held_fold(self, job: str, iteration: int) -> StepRecord | None:
        return self.state.held_fold(job, iteration)

    def admit_job(self, job: str) -> bool:
        from perfd.engine.root import ENGINE_AGENT

        return self.guard.admit_job(job, ENGINE_AGENT)

    def ingest_records(self, agent_id: str, events: Sequence[Mapping[str, object]],
                       collectives: Sequence[CollectiveRecord]) -> None:
        held = self.guard.collectives(agent_id, collectives) if collectives else []
        if held:
            self.state.ingest_collectives(agent_id, held)
        typed = self.guard.typed_events(agent_id, events) if events else []
        if typed:
            self.state.ingest_events(agent_id, [ev for _i, ev, _cut in typed])

    def ingest_collective_partial(self, agent_id: str, partial: CollectivePartial,
                                  folded: bool = False) -> None:
        """A node's collective records as its agent reduced them: held by the jobs cap like the
        records themselves (the job by the agent that sent them). ``folded``: the shards fold their
        windows (:meth:`ingest_window_figures`), the store only keeps them."""
        if len(partial) and self.guard.admit_job(partial.job, agent_id):
            self.state.ingest_collective_partial(agent_id, partial, folded)

    def ingest_window_figures(self, figs: WindowFigures) -> None:
        """A shard's per-window figures of its ranks (the root admitted the job)."""
        if len(figs):
            self.state.ingest_window_figures(figs)
