"""The aggregator's view of each job's rank processes on their hosts, and of the pauses it announced.

Fed by three state events (perfd.core.events): ``rank_processes`` (collectors/ranks: each rank process's
state, CPU, run-queue wait, the processes on its CPUs, its cgroup's throttling, pressure and OOM
kills), ``job_phase`` (a checkpoint save or an evaluation begins or ends: the Megatron log, the step
hook) and ``rank_stacks`` (the Python stacks the agent took when asked). Read by the incident
snapshots (host evidence of the time, perfd.analytics.incidents.host_evidence), the live stall detector
(perfd/aggregator/stalls.py) and the host panel (/api/jobs/<job>/gpus, `perfd top`). Latest values
only, bounded: jobs (perfd.core.limits.MAX_JOBS), ranks per report (MAX_RANKS_PER_AGENT), phases and stack
answers per job. One lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from perfd.core import limits as L
from perfd.core.clock import REAL_CLOCK, Clock
from perfd.core.events import (
    JOB_PHASE,
    PHASES,
    RANK_PROCESSES,
    RANK_STACKS,
    LaunchExit,
    Phase,
    RankHost,
    RankProcesses,
    RankStack,
    RankStacks,
    payload_of,
)
from perfd.core.typed import obj

MAX_PHASE_KEYS = 4096  # announcing sources per job (a rank's hook, the log)
MAX_STACK_ANSWERS = 8  # stacks answers kept per job (the newest)
# A report older than this is not "now": the agent that sent it stopped reporting (gone, cut off).
STALE_AFTER_S = 15.0


class HostObservation(RankHost, total=False):
    """A rank's observation as the aggregator holds it: the agent's, with where and when it came."""

    node: str  # the agent's node
    agent: str
    arrived_at: float  # the aggregator's clock
    node_values: dict[str, float]  # node-wide values read beside it (RankProcesses.node)


class HeldStack(RankStack, total=False):
    """One rank's answer to a stacks request, with the node and agent that gave it."""

    node: object  # the event's node label, as it came
    agent: str


class HeldStacks(RankStacks, total=False):
    node: object  # the event's node label, as it came


@dataclass(frozen=True)
class Announced:
    """A pause a job announced and has not ended (perfd.core.events.JobPhase)."""

    phase: Phase
    since: float  # when it arrived (the aggregator's clock)
    iteration: int | None


def _observation(r: RankHost, node: str, agent: str, arrived_at: float,
                 node_values: Mapping[str, float] | None) -> HostObservation:
    return HostObservation(**r, node=node, agent=agent, arrived_at=arrived_at,
                           node_values=dict(node_values or {}))


class HostView:
    def __init__(self, max_jobs: int = L.MAX_JOBS, clock: Clock = REAL_CLOCK) -> None:
        self.clock = clock  # when an observation or announcement arrived
        self._lock = threading.Lock()
        self.max_jobs = max_jobs
        # job -> (agent, node) -> (arrived at, payload of its latest rank_processes)
        self._ranks: OrderedDict[str, dict[tuple[str, str], tuple[float, RankProcesses]]] = OrderedDict()
        # job -> source key -> its pause while announced and not ended
        self._phases: dict[str, dict[tuple[str, str], Announced]] = {}
        self._phase_ended: dict[str, float] = {}  # job -> when its last announced pause ended
        # job -> command id -> agent -> payload
        self._stacks: dict[str, OrderedDict[str, dict[str, HeldStacks]]] = {}
        # job -> rank -> its newest observation a later step record confirms was taken while the job
        # stepped: what a finished job's report fits its data-loading action to (its CPUs while it
        # trained: its workers, its load; not its teardown, not its exit)
        self._running: dict[str, dict[int, HostObservation]] = {}
        # job -> rank -> its newest observation of a live process, until a step confirms it
        self._unconfirmed: dict[str, dict[int, HostObservation]] = {}
        self._ended: dict[str, tuple[float, str]] = {}  # job -> (when, why) its processes ended

    # ---- state events (the gRPC side) -----------------------------------------------------------
    def on_rank_processes(self, agent_id: str, ev: Mapping[str, object]) -> bool:
        p: RankProcesses | None = payload_of(ev, RANK_PROCESSES)
        if p is None or not isinstance(p.get("job"), str) or not isinstance(p.get("ranks"), list):
            return False
        ranks = [RankHost(**r) for r in p["ranks"][:L.MAX_RANKS_PER_AGENT] if isinstance(r, Mapping)
                 and isinstance(r.get("rank"), int) and isinstance(r.get("pid"), int)]
        node = str(obj(ev.get("labels")).get("node") or agent_id)
        job = p["job"]
        now = self.clock.time()
        launch = p.get("launch") if isinstance(p.get("launch"), Mapping) else None
        kept = RankProcesses(**p)
        kept["ranks"] = ranks
        with self._lock:
            held = self._ranks.pop(job, None) or {}
            held[(agent_id, node)] = (now, kept)
            self._note_end(job, held, launch, now)
            self._ranks[job] = held  # newest last: the oldest job goes first past the cap
            pending = self._unconfirmed.setdefault(job, {})
            for r in ranks:
                if r.get("state") not in ("gone", "zombie"):
                    pending[r["rank"]] = _observation(r, node, agent_id, now, p.get("node"))
            while len(self._ranks) > self.max_jobs:
                old, _ = self._ranks.popitem(last=False)
                self._phases.pop(old, None)
                self._stacks.pop(old, None)
                self._phase_ended.pop(old, None)
                self._running.pop(old, None)
                self._unconfirmed.pop(old, None)
                self._ended.pop(old, None)
        return True

    def stepped(self, job: str, now: float | None = None) -> None:
        """The job's step records arrived at ``now``: every observation of its processes that arrived
        before them was taken while it stepped (collectors/ranks reports every second)."""
        now = self.clock.time() if now is None else now
        with self._lock:
            pending = self._unconfirmed.get(job)
            if not pending:
                return
            seen = [r for r, o in pending.items() if o["arrived_at"] <= now]
            if seen:
                running = self._running.setdefault(job, {})
                for r in seen:
                    running[r] = pending.pop(r)

    def _note_end(self, job: str, held: Mapping[tuple[str, str], tuple[float, RankProcesses]],
                  launch: LaunchExit | None, now: float) -> None:
        """Whether the job's processes ended, from its reports (lock held): its launch manifest says the
        launch exited, or every rank process any agent follows is gone; a live rank undoes it."""
        ranks = [r for _, p in held.values() for r in p["ranks"]]
        if any(r.get("state") not in ("gone", "zombie") for r in ranks):
            self._ended.pop(job, None)
            return
        if job in self._ended:
            return  # when it ended is when it was first seen so
        if launch is not None and launch.get("status") == "exited":
            code, at = launch.get("exit_code"), launch.get("ended")
            self._ended[job] = (float(at) if isinstance(at, (int, float)) else now,
                                f"its launch exited{f' with code {code}' if isinstance(code, int) else ''} "
                                "(launch manifest)")
        elif ranks:
            gone = [t for r in ranks if isinstance(t := r.get("state_since"), (int, float))]
            self._ended[job] = (max(gone) if gone else now,
                                f"its {len(ranks)} rank process(es) exited (gone from their hosts)")

    def ended(self, job: str) -> tuple[float, str] | None:
        """(when, why) the job's processes ended, as its agents report them; None while any runs."""
        with self._lock:
            return self._ended.get(job)

    def on_job_phase(self, agent_id: str, ev: Mapping[str, object]) -> bool:
        p = payload_of(ev, JOB_PHASE)
        if p is None or p.get("phase") not in PHASES or p.get("state") not in ("begin", "end"):
            return False
        job = str(p.get("job") or ev.get("job") or "")
        rank = p.get("rank")
        key = (agent_id, str(rank) if isinstance(rank, int) else "log")
        with self._lock:
            held = self._phases.setdefault(job, {})
            if p["state"] == "end":
                if held.pop(key, None) is not None:
                    self._phase_ended[job] = self.clock.time()
            elif key in held and held[key].phase == p["phase"]:
                pass  # announced again: it began when it first did (a re-announcement is no new pause)
            elif key in held or len(held) < MAX_PHASE_KEYS:
                it = p.get("iteration")
                held[key] = Announced(p["phase"], self.clock.time(), it if isinstance(it, int) else None)
        return True

    def on_rank_stacks(self, agent_id: str, ev: Mapping[str, object]) -> bool:
        p: RankStacks | None = payload_of(ev, RANK_STACKS)
        if p is None or not isinstance(p.get("ranks"), Mapping):
            return False
        job = str(p.get("job") or ev.get("job") or "")
        cid = str(p.get("command_id") or "")
        with self._lock:
            held = self._stacks.setdefault(job, OrderedDict())
            answer = HeldStacks(**p, node=obj(ev.get("labels")).get("node"))
            held.setdefault(cid, {})[agent_id] = answer
            held.move_to_end(cid)
            while len(held) > MAX_STACK_ANSWERS:
                held.popitem(last=False)
        return True

    # ---- readers ---------------------------------------------------------------------------------
    def observations(self, job: str, now: float | None = None, max_age_s: float = STALE_AFTER_S
                     ) -> dict[int, HostObservation]:
        """rank -> its newest observation (a RankHost mapping) with ``node``, ``agent`` and
        ``arrived_at``, from reports that arrived within ``max_age_s``."""
        now = self.clock.time() if now is None else now
        with self._lock:
            reports = list((self._ranks.get(job) or {}).items())
        out: dict[int, HostObservation] = {}
        for (agent, node), (arrived, p) in reports:
            if now - arrived > max_age_s:
                continue
            for r in p["ranks"]:
                held = out.get(r["rank"])
                if held is None or arrived >= held["arrived_at"]:
                    out[r["rank"]] = _observation(r, node, agent, arrived, p.get("node"))
        return out

    def last_running(self, job: str) -> dict[int, HostObservation]:
        """rank -> its newest observation taken while the job stepped (a step record came after it;
        as :meth:`observations`, any age)."""
        with self._lock:
            return {r: o.copy() for r, o in (self._running.get(job) or {}).items()}

    def agents_of(self, job: str) -> set[str]:
        """The agents that report the job's rank processes (where a stacks request goes)."""
        with self._lock:
            return {agent for agent, _ in (self._ranks.get(job) or {})}

    def active_phase(self, job: str) -> tuple[str, float] | None:
        """The announced pause of the job still going (the one begun first), or None."""
        with self._lock:
            held = list((self._phases.get(job) or {}).values())
        if not held:
            return None
        first = min(held, key=lambda h: h.since)
        return first.phase, first.since

    def phase_ended_at(self, job: str) -> float | None:
        """When the job's last announced pause ended (its steps come some seconds after)."""
        with self._lock:
            return self._phase_ended.get(job)

    def stacks(self, job: str, command_id: str, agents: Collection[str] | None = None
               ) -> dict[str, HeldStack]:
        """rank -> {pid, stack | error, node, agent} of one stacks request's answers so far, from
        ``agents`` only (those it was sent to) when given."""
        with self._lock:
            held = self._stacks.get(job)
            answers = dict(held.get(command_id) or {}) if held is not None else {}
        out: dict[str, HeldStack] = {}
        for agent, p in answers.items():
            if agents is not None and agent not in agents:
                continue
            for rank, entry in (p.get("ranks") or {}).items():
                if isinstance(entry, Mapping):
                    out[str(rank)] = HeldStack(**entry, node=p.get("node"), agent=agent)
        return out

    def forget(self, job: str) -> None:
        with self._lock:
            self._ranks.pop(job, None)
            self._phases.pop(job, None)
            self._stacks.pop(job, None)
            self._phase_ended.pop(job, None)
            self._running.pop(job, None)
            self._unconfirmed.pop(job, None)
            self._ended.pop(job, None)

    def forget_agent(self, agent_id: str) -> None:
        with self._lock:
            for held in self._ranks.values():
                for key in [k for k in held if k[0] == agent_id]:
                    del held[key]
            for phases in self._phases.values():
                for key in [k for k in phases if k[0] == agent_id]:
                    del phases[key]
