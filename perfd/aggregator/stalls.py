"""Each job's live stall: checked every aggregator tick (perfd.analytics.incidents.stall decides), opened
as an incident within seconds of the silence limit, with its ranks, each rank's process state, the Python
stacks the agents take when asked (a ``stacks`` command, perfd/agent/stacks.py) and each rank's last
collective; closed when steps resume.

When the record that ends the silence arrives, the job's analysis sees one slow iteration (its step
took the whole stop): that incident takes the stall over — its evidence (a stopped process, say) and
its stall section — so the episode is one incident whose cost is Σ(step − steady median)
(perfd/aggregator/incidents.py). A stall no slow step follows (the job exited, a record averaged over
a long log interval) closes on its own, its cost the silence beyond one usual interval.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import statistics
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from perfd.aggregator.capture_records import CaptureRecord
from perfd.aggregator.state_changes import Changes, writes
from perfd.analytics.incidents.cadence import PauseSighting
from perfd.analytics.incidents.detect import Incident, stall_incident
from perfd.analytics.incidents.evidence import StallReason
from perfd.analytics.incidents.incident_evidence import Withdrawal
from perfd.analytics.incidents.stall import (
    PHASE_MAX_S,
    CaptureSpan,
    RankSeen,
    StallCheck,
    StallInputs,
    Status,
    check_stall,
    delivery_only,
    job_clock_gap_s,
)
from perfd.core import shared_thresholds as th
from perfd.core.clock import REAL_CLOCK, Clock
from perfd.core.model import CPU
from perfd.transport.codec import COMMAND_STACKS, Command

if TYPE_CHECKING:
    from perfd.aggregator.collectives import CollectiveStore
    from perfd.aggregator.hosts import HostView
    from perfd.aggregator.incidents import IncidentTracker
    from perfd.aggregator.snapshot import JobSnapshot
    from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis
    from perfd.analytics.run.run_result import RunAnalysis

log = logging.getLogger(__name__)

CADENCE_RECORDS = 20  # the newest records whose gaps give the job's cadence (their median)
# A closed stall waits this long for the analysis to take in the record that ended it (and the slow
# incident to take the stall over) before it is recorded on its own.
CLOSE_GRACE_S = 10.0
EXIT_GRACE_S = th.STALL_EXIT_GRACE_S.value
GPU_UTIL = "perfd_gpu_utilization_ratio"
# What the ranks show while their job is between steps, kept for the loop's own pauses (which work each
# was: perfd.analytics.incidents.cadence): taken at a tick once the silence is two usual steps long, of
# at most this many ranks (a save or an evaluation is every rank's), the newest this many per job (the
# record that ends a pause comes seconds after it: minutes of ticks).
PAUSE_SIGHT_FROM = 2.0
PAUSE_SIGHT_RANKS = 16
PAUSE_SIGHTINGS = 512

SendCommand = Callable[[str, Command], bool]

# What a rank's own process shows (stopped, gone): a stall that had it keeps it over a later check
# without it (the rank continued, the silence not over yet).
_PROCESS_REASONS = frozenset({StallReason.STOPPED, StallReason.GONE})


class StallSource(Protocol):
    """What the stall watch reads and updates (perfd.aggregator.job_analyses, and the state that
    composes it, give it): the job's snapshot (its last record, analysis, placement, GPU and host
    views), its collective analysis and capture records, the rank hosts' announced pauses and stacks,
    and the incident tracker its stalls go to."""

    incidents: IncidentTracker
    hosts: HostView
    collectives: CollectiveStore
    def captures_of(self, job: str) -> list[CaptureRecord]: ...

    def snapshot(self, job: str) -> JobSnapshot | None: ...

    def collective_analysis(self, job: str, force: bool = False, cached: bool = False
                            ) -> CollectiveAnalysis | None: ...

    def track_live_incidents(self, job: str, found: Sequence[Incident], now: float) -> None: ...


def _weaker(held: StallCheck, new: StallCheck) -> bool:
    return bool(_PROCESS_REASONS & set(held.reasons)) and not _PROCESS_REASONS & set(new.reasons)


@dataclass
class Stall:
    """A job's open stall (or one closed, waiting to be handed to the incident tracker)."""

    first_iteration: int
    last_iteration: int  # while open: first + a log interval - 1; once closed: the newest that arrived
    started_at: float | None  # when the last record before it arrived
    opened_at: float
    check: StallCheck
    command_id: str | None = None
    agents_asked: list[str] = field(default_factory=list)
    collectives: dict[int, dict[str, Any]] = field(default_factory=dict)
    collectives_version: int = -1
    closed_at: float | None = None
    # Once closed: the longest gap between the records' own end times over the silence (the job's
    # clock); None when the records carry none.
    job_gap_s: float | None = None
    exited: bool = False  # closed because every rank process was gone, no step after it


def capture_spans(records: Sequence[CaptureRecord]) -> list[CaptureSpan]:
    """The job's capture records as the stall check reads them
    (perfd.analytics.incidents.stall.CaptureSpan)."""
    out = []
    for c in records:
        # Asked for or running, or ended having run (or failed while it may have held a step); one
        # never sent (undeliverable, skipped, refused) never ran.
        status, asked = c.status, c.requested_at
        if not (status.live or status.ended) or not isinstance(asked, (int, float)):
            continue
        end = c.finished_at if status.ended else None
        out.append(CaptureSpan(c.id, c.tool, float(asked),
                               float(end) if isinstance(end, (int, float)) else
                               (float(asked) if status.ended else None)))
    return out


class StallWatch:
    def __init__(self, changes: Changes, send: SendCommand | None = None,
                 phase_max_s: float = PHASE_MAX_S, clock: Clock = REAL_CLOCK) -> None:
        """``changes``: the state's change count (a tick is a write: the job's snapshot shows its
        stall); ``send``: how a stall asks the ranks' agents for their stacks (the server's
        send_command; None: it does not ask); ``phase_max_s``: how long after a job's last record its
        announced pauses may hold a stall back (the aggregator's --stall-phase-max-s;
        perfd.core.shared_thresholds.STALL_PHASE_MAX_S); ``clock``: what "now" is at a tick given none."""
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, Stall] = {}
        self.changes = changes
        self.send = send
        self.opened_total: dict[str, int] = {}
        self.late_total: dict[str, int] = {}  # stalls withdrawn: their records came late (job clock)
        self.phase_max_s = phase_max_s
        self._sightings: dict[str, deque[PauseSighting]] = {}  # job -> what its ranks showed between steps

    def stalled(self, job: str) -> StallCheck | None:
        """The job's open stall's latest check (None: no open stall)."""
        with self._lock:
            st = self._open.get(job)
        return st.check if st is not None and st.closed_at is None else None

    def sightings(self, job: str) -> tuple[PauseSighting, ...]:
        """What the job's ranks showed at the ticks it was between steps (oldest first)."""
        with self._lock:
            return tuple(self._sightings.get(job, ()))

    def forget(self, job: str) -> None:
        with self._lock:
            self._sightings.pop(job, None)
            self._open.pop(job, None)
            self.opened_total.pop(job, None)
            self.late_total.pop(job, None)

    @writes
    def tick(self, state: StallSource, job: str, now: float | None = None) -> StallCheck:
        """Check the job now; open, update or close its stall incident. Returns the check. A write
        whatever it found: the job's snapshot is built anew after it."""
        return self._tick(state, job, self.clock.time() if now is None else now)

    def _tick(self, state: StallSource, job: str, now: float) -> StallCheck:
        snap = state.snapshot(job)
        check, last_it, n_its = self._check(state, snap, now)
        with self._lock:
            st = self._open.get(job)
        if check.status is Status.STALLED and (st is None or st.closed_at is not None):
            first = (last_it + 1) if last_it is not None else 0
            st = Stall(first, first + max(1, n_its) - 1, snap.overview.last_step_time if snap is not None
                       else None, now, check)
            with self._lock:
                self._open[job] = st
                self.opened_total[job] = self.opened_total.get(job, 0) + 1
            self._ask_stacks(state, job, st)
        elif st is None:
            if check.status is Status.RUNNING and check.silent_s is not None:
                state.incidents.close_orphan_stalls(job, now)  # one a restart left open: the job steps
            return check
        elif st.closed_at is None:
            resumed = check.status in (Status.RUNNING, Status.ENDED) and (
                check.status is Status.ENDED or (last_it is not None and last_it >= st.first_iteration))
            if resumed:
                st.closed_at = now
                st.exited = check.status is Status.ENDED and not (last_it is not None
                                                                 and last_it >= st.first_iteration)
                if last_it is not None:  # steps done before the stop arrive with the resumed ones
                    st.last_iteration = max(st.last_iteration, last_it)
                if st.exited and now - (st.started_at or st.opened_at) <= EXIT_GRACE_S:
                    # The job's exit (teardown after its last step), not a stall: taken back.
                    with self._lock:
                        self._open.pop(job, None)
                    if state.incidents.withdraw(job, f"stall-{st.first_iteration}", now, Withdrawal.JOB_EXIT):
                        log.info("job %s: the silence after iteration %d ended with the job's exit %.0f s "
                                 "after its last step: not a stall", job, st.first_iteration - 1,
                                 now - (st.started_at or st.opened_at))
                    return check
            elif check.status is Status.SILENT or (check.status is Status.STALLED
                                                   and _weaker(st.check, check)):
                # Still silent, with less to show now (a stopped rank continued, idle or busy, and its
                # records are not in yet): the stall keeps what made it one (the stopped state, the
                # reasons) and only its silence grows. Before, a closed stop's evidence read "running".
                st.check = dataclasses.replace(st.check, silent_s=check.silent_s)
            elif check.status is not Status.RUNNING:
                st.check = check
        if st.closed_at is not None:
            a = snap.analysis if snap is not None else None
            seen = a.iterations[-1].iteration if a is not None and len(a.iterations) else None
            if (seen is None or seen < st.first_iteration) and now - st.closed_at < CLOSE_GRACE_S \
                    and check.status is not Status.ENDED:
                return check  # the analysis has not taken in the record that ended it yet
            if seen is not None:
                st.last_iteration = max(st.last_iteration, seen)
            with self._lock:
                self._open.pop(job, None)
            if not st.exited:
                st.job_gap_s = job_clock_gap_s(_ends_since(a, st.first_iteration - 1))
                if delivery_only(st.check, st.job_gap_s):
                    self._withdraw_late(state, job, st, now)
                    return check
        self._update_incident(state, job, st, now)
        return check

    def _withdraw_late(self, state: StallSource, job: str, st: Stall, now: float) -> None:
        """The records came late, the job did not stop: no stall (logged and counted)."""
        self.late_total[job] = self.late_total.get(job, 0) + 1
        snap = state.snapshot(job)
        arrived = snap.overview.last_step_time if snap is not None else None
        late = (arrived - st.started_at) if isinstance(arrived, (int, float)) and st.started_at else None
        log.warning("job %s: no record arrived for %s after iteration %d, but the records' own times show "
                    "no gap over %.1f s (limit %.1f s): they came late, the job did not stop; the stall "
                    "is withdrawn (%d such for this job)", job,
                    f"{late:.0f} s" if late is not None else "a while", st.first_iteration - 1,
                    st.job_gap_s or 0.0, st.check.limit_s or 0.0, self.late_total[job])
        state.incidents.withdraw_stall(job, st.first_iteration, now, Withdrawal.LATE_RECORDS)

    # ---- inputs --------------------------------------------------------------------------------------
    def _check(self, state: StallSource, snap: JobSnapshot | None, now: float
               ) -> tuple[StallCheck, int | None, int]:
        a = snap.analysis if snap is not None else None
        if snap is None or a is None or len(a.iterations) < 3:
            return StallCheck(Status.RUNNING), None, 1
        job, ov = snap.job, snap.overview
        rows = a.iterations
        k = min(len(rows), CADENCE_RECORDS + 1)
        ends = [rows.get(i, "end_time") for i in range(len(rows) - k, len(rows))]
        its = [rows.get(i, "iteration") for i in range(len(rows) - k, len(rows))]
        gaps = [b - a_ for a_, b in itertools.pairwise(ends) if a_ is not None and b is not None and b > a_]
        steps = [b - a_ for a_, b in itertools.pairwise(its) if b > a_]
        cadence = statistics.median(gaps) if gaps else None
        placed = snap.placed_ranks
        util: dict[int, float] = {}
        values = snap.gpus((GPU_UTIL,), procs=False)[1] if placed else {}
        if values:  # none where the GPUs' series stay on their agents (the engine's root)
            for r, pl in placed.items():
                v = values.get((pl.node, pl.gpu), {}).get(GPU_UTIL)
                if v is not None:
                    util[r] = v
        obs = snap.hosts(now)
        seen = [RankSeen(r, str(o.get("state")), o.get("cpu_cores"), util.get(r), o.get("pid"), o.get("node"),
                         _started(o)) for r, o in sorted(obs.items())]
        try:
            coll = state.collective_analysis(job, cached=True)
        except Exception:  # counted in the collective store
            coll = None
        pending = coll is not None and coll.active_hangs > 0
        check = check_stall(StallInputs(now, ov.last_step_time, cadence, seen, pending,
                                        state.hosts.active_phase(job), state.hosts.phase_ended_at(job),
                                        self.phase_max_s, capture_spans(state.captures_of(job))))
        if cadence and check.silent_s is not None and check.silent_s >= PAUSE_SIGHT_FROM * cadence:
            self._sight(job, now, util, obs)
        return check, its[-1], int(statistics.median(steps)) if steps else 1

    def _sight(self, job: str, now: float, util: Mapping[int, float], obs: Mapping[int, Mapping[str, Any]]
               ) -> None:
        """What the job's ranks show now, while it is between steps: its GPUs' utilisation (now), its
        processes' disk writes (over the collect interval that ended when the host observation was taken: its
        time is that one, the rank's node's clock, as the step records' times are)."""
        out = []
        with self._lock:
            held = self._sightings.setdefault(job, deque(maxlen=PAUSE_SIGHTINGS))
            had = {(s.rank, s.time) for s in held if s.write_bytes_per_s is not None}
        for r in sorted({*util, *obs})[:PAUSE_SIGHT_RANKS]:
            if util.get(r) is not None:
                out.append(PauseSighting(now, r, gpu_util=util[r]))
            o = obs.get(r) or {}
            at, wr = o.get("observed_at"), o.get("write_bytes_per_second")
            if isinstance(at, (int, float)) and isinstance(wr, (int, float)) and (r, float(at)) not in had:
                out.append(PauseSighting(float(at), r, write_bytes_per_s=float(wr)))
        with self._lock:
            held.extend(out)

    def _ask_stacks(self, state: StallSource, job: str, st: Stall) -> None:
        """A ``stacks`` command to every agent that reports the job's rank processes: their Python
        stacks come back as ``rank_stacks`` events and join the stall."""
        if self.send is None:
            return
        import uuid

        st.command_id = uuid.uuid4().hex[:12]
        cmd = Command(kind=COMMAND_STACKS, job=job, ranks=tuple(st.check.stuck_ranks), id=st.command_id)
        for agent in sorted(state.hosts.agents_of(job)):
            try:
                if self.send(agent, cmd):
                    st.agents_asked.append(agent)
            except Exception:  # a closed stream: the stall goes on without that agent's stacks
                log.exception("stacks request to agent %s failed", agent)

    def _update_incident(self, state: StallSource, job: str, st: Stall, now: float) -> None:
        version, last = state.collectives.last_per_rank(job)
        if version != st.collectives_version:
            st.collectives = {r: {"last": c} for r, c in last.items()}
            st.collectives_version = version
            try:
                coll = state.collective_analysis(job, cached=True)
            except Exception:  # counted in the collective store
                coll = None
            # The op each rank is stuck in, or never reached (the hang detector's: its records are
            # only the completed ones)
            for h in coll.hangs if coll is not None else []:
                if not h.active:
                    continue
                op = {"op": h.op, "seq": h.seq, "pg": h.process_group, "user_frame": h.user_frame}
                for r in h.stuck_ranks:
                    st.collectives.setdefault(r, {})["pending"] = op
                for r in h.ranks_not_joined:
                    st.collectives.setdefault(r, {})["not_joined"] = op
        # Only the answers of the agents the request went to: another's "stacks" for the command are
        # not the job's (a forged stack once went into another job's incident).
        stacks = state.hosts.stacks(job, st.command_id, st.agents_asked) if st.command_id else {}
        extra = {"stacks": stacks, "stacks_asked": {"command_id": st.command_id, "agents": st.agents_asked},
                 "collectives": {str(r): c for r, c in sorted(st.collectives.items())}}
        check = st.check
        if st.exited and st.closed_at is not None and st.started_at is not None:
            # no step ended it: the silence lasted until the job was gone
            check = dataclasses.replace(check, silent_s=max(0.0, st.closed_at - st.started_at))
        elif st.closed_at is not None and check.silent_s is not None:
            # the silence ended when steps resumed: measured to then, not to now
            snap = state.snapshot(job)
            arrived = snap.overview.last_step_time if snap is not None else None
            if isinstance(arrived, (int, float)) and st.started_at is not None:
                check = dataclasses.replace(check, silent_s=max(0.0, arrived - st.started_at))
            if st.job_gap_s is not None and check.silent_s is not None:
                # the job's clock: records that came later than the job made them are not its silence
                check = dataclasses.replace(check, silent_s=min(check.silent_s, st.job_gap_s))
        snap = state.snapshot(job)
        a = snap.analysis if snap is not None else None
        world = a.job.layout.world_size if a is not None else None
        inc: Incident = stall_incident(check, st.first_iteration, st.last_iteration, st.started_at,
                                       st.opened_at, st.closed_at, single_rank=world == 1, extra=extra,
                                       cpu_only=a is not None and a.job.device == CPU)
        state.track_live_incidents(job, [inc], now)


def _ends_since(a: RunAnalysis | None, iteration: int) -> list[float | None]:
    """The records' own end times, in order, from ``iteration`` (the last before a silence) on."""
    if a is None:
        return []
    rows = a.iterations
    out: list[float | None] = []
    for i in range(len(rows) - 1, -1, -1):
        it = rows.get(i, "iteration")
        if it < iteration:
            break
        end = rows.get(i, "end_time")
        out.append(float(end) if isinstance(end, (int, float)) else None)
    return out[::-1]


def _started(o: Mapping[str, Any]) -> float | None:
    """When the rank's process started, on the aggregator's clock: the agent's reading moved by the
    offset between its clock and ours at arrival (a node's skew is not a new run)."""
    started, observed, arrived = o.get("started_at"), o.get("observed_at"), o.get("arrived_at")
    if isinstance(started, (int, float)) and isinstance(observed, (int, float)) \
            and isinstance(arrived, (int, float)):
        return float(started) + float(arrived) - float(observed)
    return None
