"""A stall seen live: a job whose ranks stopped stepping, told apart from a pause it announced.

The job is *silent* once no step record has come for :func:`stall_limit` of its usual interval
between records — STALL_CADENCE_FACTOR times the median gap between its records (the record
cadence: with a log interval of 10 that is 10 steps, not one), and at least STALL_FLOOR_S (counted
from the end of an announced pause when one ended since: its steps come some seconds after). Silence
alone is not a stall (a record can be late): it is one when something corroborates it — a rank
process stopped (SIGSTOP, a debugger), gone or blocked in disk sleep, every rank process idle (no
CPU, and no GPU where the GPU is known), or a collective the Flight Recorder shows stuck. A
checkpoint save or an evaluation that the log or the step hook announced holds the stall back (the
loop pauses on purpose), and the silence after it counts from its end — but for at most
STALL_PHASE_MAX_S after the job's last record, whatever is announced (a hook
re-announcing a save every 300 s, or any sender pulsing begin and end, held a hang back for good). A
rank stopped or gone is the kernel's word: no announcement holds it back or restarts its silence (a
stopped process is not saving). The check is pure: the aggregator hands in what it holds
(perfd/aggregator/stalls.py keeps the stall open, asks for stacks, and closes it when steps resume).

perfd's own capture holds a stall back the same way: an ncu range replays every
kernel of the step it profiles, holding that step for tens of seconds (38 s on the H100 for a
Megatron-LM step of 548 ms), and a Kineto or nsys capture slows its steps too. A capture asked for
before the silence became a stall (requested by the time the limit would have passed) holds it while
it runs, and the silence after it counts from its end. One asked for later (a rule that captures a
stalled job) explains nothing and holds nothing back. A stopped or gone rank is still a stall.

A new run starting holds it too: when every rank process started after the job's last record (a
restart from a checkpoint, a job resumed under a profiler), the silence is its start-up, for at most
STALL_PHASE_MAX_S from the newest start. The records' own times speak once they arrive: a silence
they do not show (they came late) is withdrawn (:func:`delivery_only`).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics import thresholds as th
from perfd.analytics.incidents.evidence import StallReason
from perfd.core import shared_thresholds as shared

STALL_CADENCE_FACTOR = shared.STALL_CADENCE_FACTOR.value
STALL_FLOOR_S = shared.STALL_FLOOR_S.value
IDLE_CPU_CORES = shared.STALL_IDLE_CPU_CORES.value
PHASE_MAX_S = shared.STALL_PHASE_MAX_S.value
_PROCESS_WORD = frozenset({StallReason.STOPPED, StallReason.GONE})
STARTING = "start-up"  # the phase of a held check whose rank processes all began after the last step
GPU_BUSY = th.GPM_NVML_ACTIVE.value  # a kernel resident this share of the time: the GPU still works


class Status(str, enum.Enum):
    RUNNING = "running"  # a record came within the limit (or the job has no cadence yet)
    SILENT = "silent"  # past the limit, nothing corroborates a stall (yet)
    HELD = "held"  # past the limit during an announced checkpoint save or evaluation, perfd's capture,
    # or a new run's start-up
    STALLED = "stalled"
    ENDED = "ended"  # every rank process is gone: the job exited, no stall


@dataclass(frozen=True)
class RankSeen:
    """One rank process as its node's agent last reported it (perfd.core.events.RankHost), with its GPU's
    utilisation where the rank is placed on one."""

    rank: int
    state: str
    cpu_cores: float | None = None
    gpu_util: float | None = None
    pid: int | None = None
    node: str | None = None
    started_at: float | None = None  # when its process started (the aggregator's clock, as now)


@dataclass(frozen=True)
class CaptureSpan:
    """One of perfd's captures of the job, as the capture coordinator records it (the aggregator's
    clock): when it was asked for, and when it ended (None while it is asked for or runs)."""

    id: str
    tool: str
    requested_at: float
    ended_at: float | None = None


@dataclass(frozen=True)
class StallInputs:
    now: float
    last_record_at: float | None  # when the job's last step record arrived (the aggregator's clock)
    cadence_s: float | None  # the job's median time between consecutive step records
    ranks: Sequence[RankSeen] = ()  # fresh observations only
    pending_collective: bool = False
    phase: tuple[str, float] | None = None  # an announced pause not yet ended: (phase, since)
    phase_ended_at: float | None = None  # when the last announced pause ended (the same clock as now)
    phase_max_s: float = PHASE_MAX_S  # how long after the last record announcements may hold a stall
    captures: Sequence[CaptureSpan] = ()  # the job's captures (those that hold are chosen here)


@dataclass(frozen=True)
class StallCheck:
    status: Status
    silent_s: float | None = None
    limit_s: float | None = None
    cadence_s: float | None = None
    reasons: tuple[StallReason, ...] = ()
    stuck_ranks: tuple[int, ...] = ()  # those a reason names first, then the rest
    phase: tuple[str, float] | None = None
    ranks: tuple[RankSeen, ...] = field(default=())
    capture: str | None = None  # HELD by this capture of perfd's (its id), still running

    def to_json(self) -> dict[str, object]:
        return {"status": self.status.value, "silent_s": self.silent_s, "limit_s": self.limit_s,
                "capture": self.capture,
                "cadence_s": self.cadence_s, "reasons": [r.value for r in self.reasons],
                "stuck_ranks": list(self.stuck_ranks),
                "phase": {"phase": self.phase[0], "since": self.phase[1]} if self.phase else None,
                "ranks": {str(r.rank): {"state": r.state, "cpu_cores": r.cpu_cores, "gpu_util": r.gpu_util,
                                        "pid": r.pid, "node": r.node} for r in self.ranks}}


    @staticmethod
    def from_json(d: Mapping[str, Any]) -> StallCheck:
        """Back from :meth:`to_json` (the state store's incidents; a rank's start is not kept)."""
        phase = d.get("phase")
        ranks = d.get("ranks") or {}
        return StallCheck(
            Status(str(d.get("status"))), _num(d.get("silent_s")), _num(d.get("limit_s")),
            _num(d.get("cadence_s")),
            tuple(StallReason(r) for r in d.get("reasons") or [] if r in StallReason._value2member_map_),
            tuple(int(r) for r in d.get("stuck_ranks") or []),
            ((str(phase.get("phase")), _num(phase.get("since")) or 0.0)
             if isinstance(phase, Mapping) else None),
            tuple(RankSeen(int(r), str(x.get("state")), x.get("cpu_cores"), x.get("gpu_util"), x.get("pid"),
                           x.get("node")) for r, x in ranks.items()),
            d.get("capture"))


def _num(v: object) -> float | None:
    """A number read back as it was written (an int stays one: the JSON served again is the same)."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class StallSeen:
    """A live stall as its incident keeps it: the check, when the stall opened and closed, and what the
    aggregator gathered for it (``extra``: the ranks' stacks and last collectives, as their agents sent
    them — free-form text and numbers, kept as they came)."""

    check: StallCheck
    opened_at: float
    closed_at: float | None = None
    extra: Mapping[str, object] = field(default_factory=dict)  # what the aggregator gathered (stacks, ...)

    def to_json(self) -> dict[str, object]:
        return {**self.check.to_json(), "opened_at": self.opened_at, "closed_at": self.closed_at,
                **self.extra}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> StallSeen:
        """Back from :meth:`to_json` (the state store's incidents)."""
        own = {"status", "silent_s", "limit_s", "capture", "cadence_s", "reasons", "stuck_ranks", "phase",
               "ranks", "opened_at", "closed_at"}
        return StallSeen(StallCheck.from_json(d), _num(d.get("opened_at")) or 0.0, _num(d.get("closed_at")),
                         {k: v for k, v in d.items() if k not in own})


def stall_limit(cadence_s: float) -> float:
    """Seconds without a record after which a job is silent."""
    return max(STALL_CADENCE_FACTOR * cadence_s, STALL_FLOOR_S)


def check_stall(inp: StallInputs) -> StallCheck:
    """Where the job stands now (see the module docstring)."""
    if inp.last_record_at is None or inp.cadence_s is None or inp.cadence_s <= 0:
        return StallCheck(Status.RUNNING)
    ranks = tuple(sorted(inp.ranks, key=lambda r: r.rank))
    gone = [r for r in ranks if r.state in ("gone", "zombie")]
    stopped = [r for r in ranks if r.state == "stopped"]
    # An announced pause is not silence: after one, the job's silence counts from its end (its steps
    # come a record interval and the pipeline's delay after it) — up to the cap after the last record,
    # and never for a stopped or gone rank.
    held_until = inp.last_record_at + inp.phase_max_s
    ended = inp.phase_ended_at if inp.phase_ended_at is not None and not (stopped or gone) else None
    quiet_since = max(inp.last_record_at, min(ended, held_until) if ended is not None else inp.last_record_at)
    limit = stall_limit(inp.cadence_s)
    running, capture_end = holding_captures(inp.captures, inp.last_record_at, limit)
    if capture_end is not None and not (stopped or gone):
        quiet_since = max(quiet_since, capture_end)
    silent = max(0.0, inp.now - quiet_since)
    if silent <= limit:
        return StallCheck(Status.RUNNING, silent, limit, inp.cadence_s, ranks=ranks)
    if ranks and len(gone) == len(ranks):
        return StallCheck(Status.ENDED, silent, limit, inp.cadence_s, ranks=ranks)
    if running and not (stopped or gone) and inp.now <= held_until:  # the capture holds the step
        return StallCheck(Status.HELD, silent, limit, inp.cadence_s, stuck_ranks=tuple(r.rank for r in ranks),
                          ranks=ranks, capture=running[0].id)
    began = _new_run(ranks, inp.last_record_at)
    if began is not None and not (stopped or gone) and inp.now <= began + inp.phase_max_s:
        # Every rank process started after the job's last step: a new run (a restart from a
        # checkpoint, a resumed job) loading before its first step, not a stall. Seen on the H100:
        # Megatron-LM resumed under ncu took 42 s to its first step.
        return StallCheck(Status.HELD, silent, limit, inp.cadence_s, stuck_ranks=tuple(r.rank for r in ranks),
                          phase=(STARTING, began), ranks=ranks)
    blocked = [r for r in ranks if r.state == "disk_sleep"]
    reasons: list[StallReason] = []
    if stopped:
        reasons.append(StallReason.STOPPED)
    if gone:
        reasons.append(StallReason.GONE)
    if blocked:
        reasons.append(StallReason.IO_BLOCKED)
    alive = [r for r in ranks if r not in gone and r not in stopped]
    if alive and all(_idle(r) for r in alive):
        reasons.append(StallReason.IDLE)
    if inp.pending_collective:
        reasons.append(StallReason.PENDING_COLLECTIVE)
    named = [*stopped, *gone, *blocked]
    stuck = tuple(dict.fromkeys([r.rank for r in named] + [r.rank for r in ranks]))
    phase = inp.phase if inp.phase is not None and inp.now <= held_until else None
    if phase is not None and not (stopped or gone):
        return StallCheck(Status.HELD, silent, limit, inp.cadence_s, tuple(reasons), stuck, phase, ranks)
    status = Status.STALLED if reasons else Status.SILENT
    return StallCheck(status, silent, limit, inp.cadence_s, tuple(reasons), stuck, phase, ranks)


def _new_run(ranks: Sequence[RankSeen], last_record_at: float) -> float | None:
    """When the newest of the rank processes started, if every one started after the job's last
    record (a run that has not stepped yet); None otherwise, or when a start is unknown."""
    starts = [r.started_at for r in ranks]
    if not starts or any(t is None or t <= last_record_at for t in starts):
        return None
    return max(t for t in starts if t is not None)


def holding_captures(captures: Sequence[CaptureSpan], last_record_at: float, limit_s: float
                     ) -> tuple[list[CaptureSpan], float | None]:
    """(the captures still running that hold the job's silence back, the latest end of those that
    ended during it): only a capture asked for before the silence became a stall holds it (one asked
    for later, a rule capturing a stalled job, is not its cause)."""
    before = [c for c in captures if c.requested_at <= last_record_at + limit_s]
    running = sorted((c for c in before if c.ended_at is None), key=lambda c: c.requested_at)
    ends = [c.ended_at for c in before if c.ended_at is not None and c.ended_at > last_record_at]
    return running, max(ends) if ends else None


def _idle(r: RankSeen) -> bool:
    """No CPU progress, and no GPU progress where the rank's GPU is known."""
    if r.cpu_cores is None or r.cpu_cores >= IDLE_CPU_CORES:
        return False
    return r.gpu_util is None or r.gpu_util < GPU_BUSY


def silence_cost_s(stall: StallSeen | None) -> float | None:
    """What a stall's silence cost: the time beyond one usual interval between records. A floor under
    the cost of the incident that carries the stall: a stop that falls between two steps (after one
    ended, before the next began) lies in no step's time, and only the wall clock between records
    sees it."""
    silent = stall.check.silent_s if stall is not None else None
    if silent is None:
        return None
    cadence = stall.check.cadence_s if stall is not None else None
    return max(0.0, float(silent) - (float(cadence) if cadence is not None else 0.0))


def job_clock_gap_s(ends: Sequence[float | None]) -> float | None:
    """The longest gap between consecutive records' own end times — the job's clock (the launch's
    line times, the step hook's timestamps), not when the records reached the aggregator — over the
    records from the last one before a silence to the newest after it. None when fewer than two, or
    any lacks its time: then only the arrival clock speaks."""
    if len(ends) < 2 or any(e is None for e in ends):
        return None
    known = [float(e) for e in ends if e is not None]
    return max(b - a for a, b in itertools.pairwise(known))


def delivery_only(check: StallCheck, job_gap_s: float | None) -> bool:
    """A silence the job's own clock does not show: its records came late (an agent or the network
    held them, an aggregator restarted), the job stepped on. Not one when the job's clock is unknown, or
    shows a gap past the limit."""
    if _PROCESS_WORD & set(check.reasons):
        return False  # a rank stopped or gone is the kernel's word: the records do not overrule it
    return job_gap_s is not None and check.limit_s is not None and job_gap_s <= check.limit_s
