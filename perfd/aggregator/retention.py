"""What the aggregator still holds, over a life of months: jobs and agents come and go, and the caps
(perfd.aggregator.guard) count only what is held now.

- A job only *named* in a Hello is held while a stream of an agent naming it is open: when the
  stream ends (and at a restart, when no stream is open yet) the hold is released, and a job held by
  nobody and holding no data is dropped. One Hello naming 1,000 jobs no longer takes the jobs cap
  for the aggregator's whole life.
- A job with data (step records, job info, collectives) is held until it is *pruned*: ended
  (perfd.analytics.steps.liveness) for ``job_retention_s``, or sooner when a newcomer meets the cap or a
  quota — then the job that ended first among those held makes room. A running or stalled job is
  never pruned.
- An agent whose stream ended is *forgotten* ``agent_retention_s`` later unless it came back: its
  series leave the series cap, its latest values and process lists the joins.

Threads: the ingest event loop releases holds (stream end) and makes room (admission); the rules
thread runs :meth:`Lifecycle.housekeeping` every tick (retention), and the rule engine, the capture
coordinator and W&B drop a pruned job there, since their state is the rules thread's. Forgetting an
agent touches the ingest server's tables, so the rules thread hands it to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Collection

from perfd.aggregator import memory
from perfd.aggregator.wiring import AggregatorParts
from perfd.analytics.steps.liveness import ENDED
from perfd.core.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

# Making room asks the held jobs' states again (a job may have ended since the last housekeeping) at
# most this often: a flood of new names at the cap costs one pass a second, not one per refusal.
REASK_ENDED_S = 1.0
TRIM_EVERY_S = 10.0  # the allocator's free memory is given back at most this often (after freeing)


class Lifecycle:
    def __init__(self, agg: AggregatorParts, clock: Clock = REAL_CLOCK) -> None:
        self.agg = agg
        self.clock = clock  # the aggregator's: when a stream ended, how long a job has been ended
        self._lock = threading.Lock()
        self._gone_since: dict[str, float] = {}  # agent -> when its live stream ended
        self._pruned: deque[str] = deque()  # jobs pruned on the event loop, for the rules thread
        # job -> since when it counts as ended, as of the last housekeeping (replaced whole there):
        # making room reads it instead of asking every held job's state, which a flood of new names
        # at the cap would ask 1,000 times a refusal.
        self._ended: dict[str, float] | None = None  # None until the first housekeeping
        self._reasked_at = 0.0  # when making room last asked the candidates' states again
        self._loop: asyncio.AbstractEventLoop | None = None
        self.jobs_pruned = 0
        self.trims = 0  # memory.trim calls (after pruning, forgetting or byte evictions), and their seconds
        self.trim_s = 0.0
        self._freed_at_trim = 0  # jobs pruned + agents forgotten + byte evictions at the last trim
        self._trimmed_at = 0.0
        self.jobs_released = 0  # named only in a Hello, released when no stream named them any more
        self.agents_forgotten = 0
        agg.guard.make_room = self.make_room

    def started(self, loop: asyncio.AbstractEventLoop) -> None:
        """The aggregator restored its state and listens now: every agent it knows of is gone until
        it connects again, and no job is held by a Hello any more (no stream is open)."""
        self._loop = loop
        now = self.clock.time()
        agents = set(self.agg.state.agents_seen()) | {a for j in self.agg.guard.held_jobs()
                                                              for a in self.agg.guard.hosts(j)}
        for agent in agents:
            self.stream_ended(agent, now)
        self._ended = {j: t for j in set(self.agg.guard.held_jobs()) | set(self.agg.state.job_names())
                       if (t := self.ended_at(j, now)) is not None}

    # ---- event loop ----------------------------------------------------------------------------
    def hello(self, agent: str) -> None:
        with self._lock:
            self._gone_since.pop(agent, None)

    def stream_ended(self, agent: str, now: float | None = None) -> None:
        """The agent's live stream ended: the jobs it only named are no longer held by it."""
        with self._lock:
            self._gone_since.setdefault(agent, self.clock.time() if now is None else now)
        named_only = [j for j in self.agg.guard.jobs_of(agent) if not self._has_data(j)]
        for job in self.agg.guard.release(agent, named_only):
            self.agg.state.forget_job(job)
            self.jobs_released += 1

    def make_room(self, among: Collection[str]) -> bool:
        """Prune the job that ended first among ``among`` (the guard asks at a cap or quota): of the
        jobs the last housekeeping found ended, the first one still ended now. Before the first
        housekeeping (a restart's replay) every candidate's state is asked."""
        now = self.clock.time()
        known = self._ended
        if known is not None:
            ranked = sorted((t, j) for j in among if (t := known.get(j)) is not None)
            if not ranked and now - self._reasked_at >= REASK_ENDED_S:
                # A job may have ended since the last housekeeping (a tick ago at most): ask again,
                # at most once a REASK_ENDED_S, so that a flood of refusals asks once, not each time.
                self._reasked_at = now
                known.update((j, t) for j in among if (t := self.ended_at(j, now)) is not None)
                ranked = sorted((t, j) for j in among if (t := known.get(j)) is not None)
        else:
            ranked = sorted((t, j) for j in among if (t := self.ended_at(j, now)) is not None)
        for _t, job in ranked[:8]:  # a few, not all: one that ran again since is skipped
            if known is not None and self.ended_at(job, now) is None:
                continue
            self._prune(job, "to make room for a new job")
            if known is not None:
                known.pop(job, None)
            return True
        return False

    # ---- any thread ----------------------------------------------------------------------------
    def _has_data(self, job: str) -> bool:
        return self.agg.state.holds_data(job)

    def _live(self, agent: str) -> bool:
        with self._lock:
            return agent not in self._gone_since

    def ended_at(self, job: str, now: float) -> float | None:
        """Since when the job counts as ended (the time of its last step, or of its last activity for
        one that never stepped), None while it runs, is stalled or an agent of it is still here."""
        st = self.agg.state
        snap = st.snapshot(job)
        holders = self.agg.guard.hosts(job) | st.job_agents(job)
        if snap is None:  # held but with nothing in the job store (events only): ended once nobody is here
            if st.holds_data(job):  # its snapshot failed to build (counted): what cannot be read is kept
                return None
            return None if any(self._live(a) for a in holders) else 0.0
        last = snap.overview.last_step_time
        if last:
            # its state as of the clock (as before snapshots), not ``now``
            return float(last) if snap.state_at()[0] == ENDED else None
        if any(self._live(a) for a in holders):
            return None  # starting: no step yet, an agent of it still connected
        act = st.activity(job)
        return act[1] if act is not None else 0.0

    def prune(self, job: str, why: str) -> None:
        """Prune ``job`` now, on the event loop (its state, journal rows, guard; captures and W&B at the
        next housekeeping): the engine's root of every job lets go of a job a root of its own leads."""
        self._prune(job, why)

    def _prune(self, job: str, why: str) -> None:
        log.info("job %s pruned %s", job, why)
        agents = self.agg.guard.hosts(job) | self.agg.state.job_agents(job)
        self.agg.state.forget_job(job)
        self.agg.guard.forget_job(job)
        # Its agents that are gone and held no other job served only it: nothing they sent is read any
        # more, so they are forgotten at the next housekeeping rather than an agent retention later (a
        # job's sidecar: under a churn of jobs, each one's agent was held 15 minutes after its job went).
        orphans = [a for a in agents if not self.agg.guard.jobs_of(a)]
        with self._lock:
            for a in orphans:
                if a in self._gone_since:
                    self._gone_since[a] = 0.0
        if self.agg.store is not None:  # its journal rows too: a pruned job stays pruned at a restart
            self.agg.store.forget_job(job)
        self._pruned.append(job)
        self.jobs_pruned += 1

    # ---- rules thread --------------------------------------------------------------------------
    def housekeeping(self) -> None:
        """Prune jobs ended longer than the retention, drop what a pruned job left with the rules,
        captures and W&B, and forget agents gone longer than theirs. Called every rules tick."""
        now = self.clock.time()
        limits = self.agg.cfg.limits
        known = set(self.agg.guard.held_jobs()) | set(self.agg.state.job_names())
        ended: dict[str, float] = {}
        for job in sorted(known):
            t = self.ended_at(job, now)
            if t is not None and now - t >= limits.job_retention_s:
                self._prune(job, f"{limits.job_retention_s:.0f} s after it ended")
            elif t is not None:
                ended[job] = t
        self._ended = ended
        while self._pruned:
            job = self._pruned.popleft()
            self.agg.captures.forget_job(job)
            if self.agg.wandb is not None:
                self.agg.wandb.finish_job(job)
        with self._lock:
            due = [a for a, t in self._gone_since.items() if now - t >= limits.agent_retention_s]
        if due and self._loop is not None:
            self._loop.call_soon_threadsafe(self._forget_agents, due)
        self._trim(now)

    def _trim(self, now: float) -> None:
        """Give the memory freed by jobs pruned, agents forgotten and iterations evicted for the byte
        bound back to the system, at most every TRIM_EVERY_S (memory.trim: glibc keeps freed blocks in
        its arenas, and a churn of jobs left RSS growing with the Python heap flat;
        1,500 records of 100 KB under ``--retain-mib 16`` left 16 MiB held but 56 MB free in the
        arenas). Evictions by count are not a reason: a steady job evicts one iteration per step."""
        freed = self.jobs_pruned + self.agents_forgotten + self.agg.state.job_stats.evicted_iterations_bytes
        if freed == self._freed_at_trim or now - self._trimmed_at < TRIM_EVERY_S:
            return
        t0 = time.perf_counter()
        if memory.trim():
            self.trims += 1
            self.trim_s += time.perf_counter() - t0
        self._freed_at_trim, self._trimmed_at = freed, now

    def _forget_agents(self, agents: list[str]) -> None:
        """On the event loop: forget agents still gone (one may have come back since)."""
        for agent in agents:
            if self.agg.server.live(agent) or self._live(agent):
                continue
            with self._lock:
                self._gone_since.pop(agent, None)
            self.agg.server.forget_agent(agent)
            self.agg.forget_series(agent)
            self.agg.state.forget_agent(agent)
            if self.agg.store is not None:  # its Hello row: what a restart replays stays bounded
                self.agg.store.forget_agent(agent)
            self.agents_forgotten += 1

    def counters(self) -> dict[str, int]:
        with self._lock:
            gone = len(self._gone_since)
        return {"jobs_held": len(self.agg.guard.held_jobs()), "jobs_pruned": self.jobs_pruned,
                "jobs_released": self.jobs_released, "agents_forgotten": self.agents_forgotten,
                "agents_gone": gone, "series_held": self.agg.guard.series, "memory_trims": self.trims,
                "memory_trim_ms": round(self.trim_s * 1e3)}
