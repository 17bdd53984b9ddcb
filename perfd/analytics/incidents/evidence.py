"""Typed evidence about a slow rank, and the verdict it supports (docs/design.md §2 "Who is to blame").

Every observation that can explain a slowdown is an :class:`Evidence` of a closed set of kinds
(:class:`EvidenceKind`): the rank's process stopped, gone or OOM-killed; a foreign process on the
rank's GPU (pid, command line, GPU memory), other processes on the rank's CPUs (CPU contention) or
its cgroup's CPU quota; a power cap, thermal throttling, memory pressure, blocked I/O; a hardware
slowdown, an XID error, a clock drop, the rank's compute ratio, a straggler-detector line, a data
wait, exposed communication, a capture's finding. An
incident *accumulates* them over its life (:func:`merge`): each item keeps when it was first and last
seen and its worst value, so what was true while the incident ran is not replaced by what the GPU
shows when it closes (a co-tenant that left before the incident closed still explains it).

The verdict (:func:`decide`) is the highest item in the causal order :data:`KIND_SPECS` declares —
the rank's process itself (stopped, gone, OOM-killed), hardware faults, then a foreign process (on
its GPU or its CPUs, or a CPU quota), then the node's limits (thermal, power, memory, I/O), then the
rank's own work, then communication — at any time during the incident. A foreign process outranks
the power cap and clock drop it causes; those stay in the verdict as its effects. Nothing here is
English but the names the renderer (perfd.report.incident_text) turns into sentences. Pure;
no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from perfd.analytics import thresholds as th
from perfd.core.record_json import JsonWritten, written_after


class EvidenceKind(str, enum.Enum):
    """What an observation is about. ``str`` so that JSON carries the value as it is."""

    XID = "xid"
    HW_SLOWDOWN = "hw_slowdown"  # hw_slowdown / hw_thermal / hw_power_brake throttle reasons
    FOREIGN_PROCESS = "foreign_process"
    THERMAL = "thermal"  # sw_thermal, or a temperature well above the job's other GPUs
    POWER_CAP = "power_cap"  # sw_power_cap
    CLOCK_DROP = "clock_drop"  # SM clock below the job's median
    AFTER_CAPTURE = "after_capture"  # the slowdown began as perfd's own capture ended and outlasted it
    CAPTURE_FINDING = "capture_finding"  # a capture's timeline during the incident
    DATA_WAIT = "data_wait"  # data loading grew by a good part of the slowdown
    RANK_COMPUTE_RATIO = "rank_compute_ratio"  # per-rank timers: this rank computed longer
    STRAGGLER_LINE = "straggler_line"  # Megatron's straggler detector named the rank
    EXPOSED_COMM = "exposed_comm"  # exposed communication grew by a good part of the slowdown
    # The rank's process as the agent saw it on its node (collectors/ranks;
    # perfd.analytics.incidents.host_evidence).
    PROCESS_STOPPED = "process_stopped"  # state T/t: SIGSTOP, a debugger, a frozen container
    OOM_KILL = "oom_kill"  # the OOM killer killed a process in the rank's cgroup
    PROCESS_GONE = "process_gone"  # the rank's process exited (or is a zombie) while the job ran
    CPU_THROTTLED = "cpu_throttled"  # the rank's cgroup hit its CPU quota (CFS throttling)
    CPU_CONTENTION = "cpu_contention"  # other processes on the rank's CPUs; the rank waited for one
    MEMORY_PRESSURE = "memory_pressure"  # tasks stalled on memory (PSI), swap-in
    IO_BLOCKED = "io_blocked"  # the rank in disk sleep, tasks stalled on I/O (PSI)


class Tier(enum.IntEnum):
    """The causal order (docs/design.md §2): lower explains higher, never the other way round."""

    PROCESS = 0  # the rank's process itself: stopped, gone, OOM-killed (nothing else runs then)
    HARDWARE = 1
    FOREIGN_PROCESS = 2  # another process on the rank's GPU or CPUs, or a CPU quota: put on the rank
    THERMAL_POWER = 3  # the node's limits with no foreign cause: thermal, power, memory, I/O
    OWN_WORK = 4
    COMMUNICATION = 5


@dataclass(frozen=True)
class KindSpec:
    tier: Tier
    worse: str  # "max" or "min": which way the value gets worse
    unit: str  # of ``Evidence.worst``
    gpu_symptom: bool = False  # an effect a higher-tier GPU cause produces on the same GPU
    # A kind measured on a scale (a share of time): seen in steady state too, it still explains an
    # incident where its worst exceeds its steady level (``detail["steady_worst"]``) by this much.
    steady_margin: float | None = None
    # Can stop a rank's progress outright, not only slow it: the only kinds that lead the verdict of
    # a stall (no step at all). A rank that waits for a CPU 90% of the time still steps; a pending
    # collective beside that contention is what says why nothing moves.
    halts: bool = False
    # What the rank's GPU shows of itself (its clocks, its power, its temperature, another process on
    # it): it slows the GPU's work, never the host's data loading. Where the data wait grew by most
    # of the slowdown (a DATA_WAIT item), the GPU was waiting on data: such an item cannot lead then.
    gpu_side: bool = False


# The one declaration of each kind's place in the causal order. Within a tier, the order here
# decides (an XID before a hardware slowdown; a capture's direct view before the timers' ratio).
KIND_SPECS: dict[EvidenceKind, KindSpec] = {
    EvidenceKind.PROCESS_STOPPED: KindSpec(Tier.PROCESS, "max", "seconds", halts=True),
    EvidenceKind.OOM_KILL: KindSpec(Tier.PROCESS, "max", "count", halts=True),
    EvidenceKind.PROCESS_GONE: KindSpec(Tier.PROCESS, "max", "count", halts=True),
    EvidenceKind.XID: KindSpec(Tier.HARDWARE, "max", "xid code", halts=True),
    EvidenceKind.HW_SLOWDOWN: KindSpec(Tier.HARDWARE, "max", "count", gpu_symptom=True, gpu_side=True),
    EvidenceKind.FOREIGN_PROCESS: KindSpec(Tier.FOREIGN_PROCESS, "max", "bytes", gpu_side=True),
    # A CPU quota before contention: a throttled rank's threads count the throttled time as run-queue
    # wait, and other processes fill the CPUs it may not use (seen here: 90% wait at a 0.1-CPU quota).
    EvidenceKind.CPU_THROTTLED: KindSpec(Tier.FOREIGN_PROCESS, "max", "ratio",  # periods throttled
                                         steady_margin=th.STEADY_MARGIN.value),
    EvidenceKind.CPU_CONTENTION: KindSpec(Tier.FOREIGN_PROCESS, "max", "ratio",  # the rank's run-queue wait
                                          steady_margin=th.STEADY_MARGIN.value),
    EvidenceKind.THERMAL: KindSpec(Tier.THERMAL_POWER, "max", "celsius", gpu_symptom=True, gpu_side=True),
    EvidenceKind.POWER_CAP: KindSpec(Tier.THERMAL_POWER, "max", "watts", gpu_symptom=True, gpu_side=True),
    EvidenceKind.CLOCK_DROP: KindSpec(Tier.THERMAL_POWER, "min", "hertz", gpu_symptom=True, gpu_side=True),
    EvidenceKind.MEMORY_PRESSURE: KindSpec(Tier.THERMAL_POWER, "max", "ratio",  # PSI memory some
                                           steady_margin=th.STEADY_MARGIN.value),
    EvidenceKind.IO_BLOCKED: KindSpec(Tier.THERMAL_POWER, "max", "ratio",  # PSI io some
                                      steady_margin=th.STEADY_MARGIN.value, halts=True),
    EvidenceKind.AFTER_CAPTURE: KindSpec(Tier.OWN_WORK, "max", "times"),
    EvidenceKind.CAPTURE_FINDING: KindSpec(Tier.OWN_WORK, "max", "times"),
    EvidenceKind.DATA_WAIT: KindSpec(Tier.OWN_WORK, "max", "ratio"),
    EvidenceKind.RANK_COMPUTE_RATIO: KindSpec(Tier.OWN_WORK, "max", "times", gpu_symptom=True),
    EvidenceKind.STRAGGLER_LINE: KindSpec(Tier.OWN_WORK, "max", "count", gpu_symptom=True),
    EvidenceKind.EXPOSED_COMM: KindSpec(Tier.COMMUNICATION, "max", "ratio"),
}
_ORDER = {k: i for i, k in enumerate(KIND_SPECS)}


# Seen in this share of the rank's steady-state sightings or more: part of the job's normal state.
STEADY_PRESENT = th.STEADY_PRESENT.value


class StallReason(str, enum.Enum):
    """What corroborates a job's silence as a stall (perfd.analytics.incidents.stall; a closed set, said in
    English by perfd.report.incident_text)."""

    STOPPED = "stopped"  # a rank process in state T/t
    GONE = "gone"  # a rank process exited or a zombie, while others of the job live
    IO_BLOCKED = "io_blocked"  # a rank process in disk sleep
    IDLE = "idle"  # every rank process idle: no CPU, no GPU where known
    PENDING_COLLECTIVE = "pending_collective"  # the Flight Recorder shows a collective stuck


class Missing(str, enum.Enum):
    """Evidence whose absence leaves a verdict open (said, never guessed)."""

    PER_RANK_TIMERS = "per_rank_timers"  # --timing-log-option all / --log-straggler / the step hook
    GPU_STATE = "gpu_state"  # no NVML of the rank's GPU (agent without NVML, rank not placed)
    RANK_PLACEMENT = "rank_placement"  # no process on the job's nodes declares the rank


@dataclass(frozen=True)
class Evidence(JsonWritten):
    """One observation, accumulated over the time it was seen."""

    kind: EvidenceKind
    rank: int | None
    key: str = ""  # tells items of one kind and rank apart: a pid, a throttle reason
    worst: float | None = None  # the kind's value at its worst (see KIND_SPECS for unit, direction)
    first_seen: float | None = None  # epoch s
    last_seen: float | None = None
    n: int = 1  # times observed
    detail: Mapping[str, Any] = field(default_factory=dict)  # pid, cmdline, reasons, median, ...

    @property
    def spec(self) -> KindSpec:
        return KIND_SPECS[self.kind]

    @property
    @written_after("n")
    def tier(self) -> int:
        return int(self.spec.tier)

    def ident(self) -> tuple[EvidenceKind, int | None, str]:
        return self.kind, self.rank, self.key

    @staticmethod
    def from_json(d: Mapping[str, Any], as_written: bool = False) -> Evidence | None:
        """Back from :meth:`to_json`; None for a kind this version does not know (kept state).
        ``as_written``: numbers as they were written (an int stays one, so the state store's incidents
        are served again as they were), else as floats."""
        try:
            kind = EvidenceKind(str(d.get("kind")))
        except ValueError:
            return None
        rank = d.get("rank")

        def num(v: object) -> float | None:
            return (v if as_written else float(v)) if isinstance(v, (int, float)) else None

        return Evidence(kind, rank if isinstance(rank, int) else None, str(d.get("key") or ""),
                        num(d.get("worst")), num(d.get("first_seen")), num(d.get("last_seen")),
                        int(d.get("n") or 1), dict(d.get("detail") or {}))


def _worse(kind: EvidenceKind, a: float | None, b: float | None) -> bool:
    """b is worse than a."""
    if b is None:
        return False
    if a is None:
        return True
    return b < a if KIND_SPECS[kind].worse == "min" else b > a


def _opt(f: Callable[[list[float]], float], a: float | None, b: float | None) -> float | None:
    xs = [x for x in (a, b) if x is not None]
    return f(xs) if xs else None


def merge(kept: Iterable[Evidence], seen: Iterable[Evidence]) -> list[Evidence]:
    """``kept`` with ``seen`` folded in: an item seen again keeps its first sighting, takes the
    latest last sighting, the worst value (and that sighting's detail) and counts the sightings."""
    out: dict[tuple[EvidenceKind, int | None, str], Evidence] = {e.ident(): e for e in kept}
    for e in seen:
        old = out.get(e.ident())
        if old is None:
            out[e.ident()] = e
            continue
        worse = _worse(e.kind, old.worst, e.worst)
        out[e.ident()] = replace(
            old, worst=e.worst if worse else old.worst, first_seen=_opt(min, old.first_seen, e.first_seen),
            last_seen=_opt(max, old.last_seen, e.last_seen), n=old.n + e.n,
            detail={**old.detail, **e.detail} if worse else {**e.detail, **old.detail})
    return sorted(out.values(), key=causal_key)


def causal_key(e: Evidence) -> tuple[int, int, int, str]:
    return int(e.spec.tier), _ORDER[e.kind], e.rank if e.rank is not None else 1 << 30, e.key


@dataclass(frozen=True)
class Verdict(JsonWritten):
    """The lead cause of an incident and what it explains; ``cause`` None: unexplained."""

    cause: EvidenceKind | None
    rank: int | None
    lead: Evidence | None
    effects: tuple[Evidence, ...] = ()  # lower-tier GPU symptoms on the same rank that the lead causes
    also: tuple[Evidence, ...] = ()  # other evidence present, in causal order
    missing: tuple[Missing, ...] = ()

    @property
    @written_after("rank")
    def tier(self) -> int | None:
        """The lead's tier (None: unexplained)."""
        return self.lead.tier if self.lead else None


# A verdict's cause as a label value (perfd_job_incident_cause_info's `cause`): the kind of its lead,
# or UNEXPLAINED where nothing seen explains the incident or no verdict is decided yet.
UNEXPLAINED = "unexplained"
CAUSE_LABEL_VALUES: tuple[str, ...] = (*(k.value for k in EvidenceKind), UNEXPLAINED)


def cause_label(verdict: Verdict | None) -> str:
    return verdict.cause.value if verdict is not None and verdict.cause is not None else UNEXPLAINED


def in_steady_state(e: Evidence) -> bool:
    """Seen in half the rank's steady sightings or more (its normal state), and — for a kind on a
    scale — not worse now than there by its margin (KindSpec.steady_margin)."""
    if (e.detail.get("in_steady_state") or 0.0) < STEADY_PRESENT:
        return False
    margin, level = e.spec.steady_margin, e.detail.get("steady_worst")
    if margin is None or e.worst is None or not isinstance(level, (int, float)):
        return True
    return not (e.worst > level + margin if e.spec.worse == "max" else e.worst < level - margin)


def decide(items: Sequence[Evidence], ranks: Sequence[int] = (), missing: Sequence[Missing] = (),
           stalled: bool = False) -> Verdict:
    """The verdict over everything seen during an incident: the item highest in the causal order
    (ties: the rank the data names first, then the most sightings). GPU symptoms of lower tiers on
    the lead's rank are its effects; the rest is listed, also in causal order. ``stalled``: the
    incident is a stall alone (no step at all), which only a kind that halts (KindSpec.halts) can
    lead; without one the verdict has no lead and the stall's own reasons say what holds it."""
    # Evidence the rank's GPU showed in steady state too explains no departure from it.
    steady = [e for e in items if in_steady_state(e)]
    items = [e for e in items if e not in steady]
    if not items:
        return Verdict(None, ranks[0] if ranks else None, None, also=tuple(sorted(steady, key=causal_key)),
                       missing=tuple(missing))
    named = {r: i for i, r in enumerate(ranks)}

    def key(e: Evidence) -> tuple[int, int, int, int]:
        return (int(e.spec.tier), _ORDER[e.kind], named.get(e.rank, len(named)) if e.rank is not None
                else len(named) + 1, -e.n)

    ordered = sorted(items, key=key)
    if any(e.kind is EvidenceKind.DATA_WAIT for e in ordered):
        # The data wait grew by most of the slowdown: the GPU waited on data, so what the GPU shows of
        # itself (a power cap, a clock, another process on it) is listed, never the cause (once,
        # with the rank's NVML samples a data-loader slowdown read "not explained").
        ordered = sorted(ordered, key=lambda e: (e.spec.gpu_side, key(e)))
    if stalled and not any(e.spec.halts for e in ordered):
        return Verdict(None, ranks[0] if ranks else None, None,
                       also=tuple(ordered) + tuple(sorted(steady, key=causal_key)), missing=tuple(missing))
    lead = next(e for e in ordered if e.spec.halts) if stalled else ordered[0]
    rest = sorted((e for e in ordered if e is not lead), key=key)
    effects = tuple(e for e in rest if e.rank == lead.rank and e.spec.gpu_symptom
                    and e.spec.tier >= lead.spec.tier)
    also = tuple(e for e in rest if e not in effects) + tuple(sorted(steady, key=causal_key))
    return Verdict(lead.kind, lead.rank, lead, effects, also, tuple(missing))


def verdict_from_json(d: Mapping[str, Any] | None, as_written: bool = False) -> Verdict | None:
    """Back from :meth:`Verdict.to_json` (a kept incident; ``as_written``: as Evidence.from_json)."""
    if not d:
        return None
    lead = Evidence.from_json(d["lead"], as_written) if isinstance(d.get("lead"), Mapping) else None

    def items(key: str) -> tuple[Evidence, ...]:
        return tuple(e for x in d.get(key) or []
                     if isinstance(x, Mapping) and (e := Evidence.from_json(x, as_written)))

    miss = []
    for m in d.get("missing") or []:
        try:
            miss.append(Missing(str(m)))
        except ValueError:
            continue
    rank = d.get("rank")
    return Verdict(lead.kind if lead else None, rank if isinstance(rank, int) else None, lead,
                   items("effects"), items("also"), tuple(miss))
