"""Goodput of a job: its wall time split by where it went. Pure.

The wall time runs from the job's start (its first start-up timestamp where the log has one, else
the start of its first logged step) to the end of its last logged step and what followed it (a final
checkpoint save), or to now while the job is stalled. Each logged step record covers ``n``
iterations of ``step_s`` mean seconds, ending at ``end_time``; the window between two records is
split, in this order of precedence:

- *restart*: the next record belongs to a new run of the job — the framework's start-up output came
  before it (``StepRecord.first_of_run``: what tells a resume apart live, where the aggregator holds
  one record per iteration), its iteration number goes back or repeats, or it is Megatron-LM's
  first-iteration log of a resumed run (a record of one iteration whose number is not a multiple of
  the log interval). The window minus the new record's own steps
  and the previous run's final checkpoint save is the restart: the old processes ending, the new
  ones starting, loading the checkpoint.
- *checkpoint* / *evaluation*: the log's own timers printed after a step (Megatron's
  ``save-checkpoint``, ``save-checkpoint-non-persistent`` and ``evaluate``: the slowest rank's time,
  which the loop waits for); the training loop's interval timer stops around both, so they are not
  inside any step time. The step hook's announced phases (``with hook.phase("checkpoint")``), timed by
  the hook and carried on the rank's next record (``paused-checkpoint``, ``paused-evaluation``),
  count the same way in the window before that record. A pause the loop takes every N steps without
  announcing it (perfd.analytics.incidents.cadence) is in the period of the step after it: its excess
  over the steady step comes out of training into *checkpoint* or *evaluation* where what the agents
  saw during it tells which, else into *cadence*.
- *training*: the record's ``n × step_s``; of it, each incident's cost (Σ step − steady median,
  perfd.analytics.incidents.detect) is *incident*, perfd's own captures' excess is *profiling*, and
  iterations a new run trains again (numbers at or below what an earlier run reached) are *redone*.
  A step is booked at the job's own speed first: up to the steady step it is training (or redone),
  its excess is the incident's or perfd's. So a step on a rank armed for a capture (perfd.core.armed: it
  runs under ncu for its process's life) is profiling for its excess over ``armed_step_s`` (the
  reference the arming cost is measured against: the job's last unarmed run's steady median,
  perfd.analytics.run.arming) and training or redone for the rest; and the incidents' and the
  captures' costs of a run come out of that run's own training and redone time (in proportion),
  never out of an earlier run's.
- *stall*: what is left of a window once the above are taken, when it exceeds
  ``GOODPUT_STALL_STEPS`` median steps (at least ``GOODPUT_STALL_FLOOR_S``); a smaller remainder is
  *other* (logging and host overhead between timed steps). A live job that has stopped stepping while
  its processes hold their GPUs adds the time since its last step as stall.
- *startup*: from the job's start to its first step's start.

Goodput (the ratio) = training ÷ wall. The parts add up to the wall time exactly (each is taken out
of the window it lies in, never more than is left of it).
"""

from __future__ import annotations

import itertools
import statistics
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypedDict

from perfd.analytics.thresholds import GOODPUT_STALL_FLOOR_S, GOODPUT_STALL_STEPS
from perfd.core.model import HOOK_PAUSE_TIMERS, TimerValue

TRAINING = "training"
INCIDENT = "incident"
PROFILING = "profiling"
REDONE = "redone"
CHECKPOINT = "checkpoint"
EVALUATION = "evaluation"
CADENCE = "cadence"
RESTART = "restart"
STALL = "stall"
STARTUP = "startup"
OTHER = "other"
# Every kind a job's time is split into (the label values of perfd_job_time_seconds_total).
KINDS: tuple[str, ...] = (TRAINING, INCIDENT, PROFILING, REDONE, CHECKPOINT, EVALUATION, CADENCE, RESTART,
                          STALL, STARTUP, OTHER)
KIND_HELP: dict[str, str] = {
    TRAINING: "steady training: logged step time outside incidents and perfd's captures",
    INCIDENT: "the excess step time of incidents (Σ step − steady time per step)",
    PROFILING: "the excess step time of perfd's own captures, and of steps on a rank armed for one (ncu) "
               "over the job's unarmed steady step",
    REDONE: "iterations trained again after a restart from an earlier checkpoint",
    CHECKPOINT: "checkpoint saves (the framework's save-checkpoint timer, or the step hook's phase)",
    EVALUATION: "evaluation passes (the framework's evaluate timer, or the step hook's phase)",
    CADENCE: "a pause the loop takes every N steps without announcing it, neither told to be an evaluation "
             "nor a checkpoint save",
    RESTART: "from one run of the job ending to the next one's first step",
    STALL: "no step while the job should be stepping (unexplained gaps; a hang)",
    STARTUP: "from the job's start to its first step",
    OTHER: "small gaps between logged steps (logging, host overhead)",
}

# Framework timers (printed after a step) that time a pause of the training loop, by kind.
PHASE_TIMERS: dict[str, str] = {
    "save-checkpoint": CHECKPOINT,
    "save-checkpoint-non-persistent": CHECKPOINT,
    "evaluate": EVALUATION,
}
# Timers that time a pause *before* the step of their record: the step hook's announced phases.
PAUSE_BEFORE_TIMERS: dict[str, str] = {timer: kind for kind, timer in HOOK_PAUSE_TIMERS.items()}


@dataclass(frozen=True)
class StepSpan:
    """One logged step record, as goodput reads it."""

    iteration: int
    end_time: float  # epoch s
    step_s: float  # mean seconds per iteration
    n: int = 1  # iterations the record covers
    after_s: Mapping[str, float] = field(default_factory=dict)  # kind -> seconds paused after it
    new_run: bool = False  # the framework's start-up output came before it (StepRecord.first_of_run)
    before_s: Mapping[str, float] = field(default_factory=dict)  # kind -> seconds paused before it
    armed: bool = False  # its rank ran armed for a capture (perfd.core.armed): its excess is perfd's


class GoodputJSON(TypedDict):
    """Goodput as JSON (:meth:`Goodput.to_json`; the aggregator adds its live parts to it)."""

    ratio: float | None
    wall_s: float
    parts_s: dict[str, float]  # kind -> seconds
    start_time: float
    end_time: float
    runs: int
    restarts: int
    notes: list[str]
    reached_iteration: int | None


@dataclass
class Goodput:
    wall_s: float
    parts: dict[str, float]  # kind -> seconds; sums to wall_s
    start_time: float
    end_time: float
    runs: int  # runs of the job seen (1 + restarts)
    notes: list[str] = field(default_factory=list)
    reached: int | None = None  # the highest iteration any of its runs logged (what a later run redoes)

    @property
    def ratio(self) -> float | None:
        return self.parts.get(TRAINING, 0.0) / self.wall_s if self.wall_s > 0 else None

    def to_json(self) -> GoodputJSON:
        return {"ratio": self.ratio, "wall_s": self.wall_s, "parts_s": dict(self.parts),
                "start_time": self.start_time, "end_time": self.end_time, "runs": self.runs,
                "restarts": self.runs - 1, "notes": list(self.notes), "reached_iteration": self.reached}

    @classmethod
    def from_json(cls, d: object) -> Goodput | None:
        """Back from :meth:`to_json` (an aggregator's answer read by `perfd report`); None when it is
        not one."""
        if not isinstance(d, Mapping):
            return None
        parts, wall = d.get("parts_s"), _num(d.get("wall_s"))
        if not isinstance(parts, Mapping) or wall is None:
            return None
        runs, restarts, reached = d.get("runs"), d.get("restarts"), d.get("reached_iteration")
        return cls(wall, {str(k): f for k, v in parts.items() if (f := _num(v)) is not None},
                   _num(d.get("start_time")) or 0.0, _num(d.get("end_time")) or 0.0,
                   runs if isinstance(runs, int) else restarts + 1 if isinstance(restarts, int) else 1,
                   [str(n) for n in d.get("notes") or []], reached if isinstance(reached, int) else None)


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class SpanColumns:
    """Step spans held as columns (a few numbers a record: a long run's records are never all
    objects at once): end time, step seconds, iteration, iterations covered; the pauses timed after
    a record and the records that start a run, by row."""

    def __init__(self) -> None:
        self.end, self.step, self.iteration, self.n = array("d"), array("d"), array("q"), array("q")
        self.after: dict[int, dict[str, float]] = {}
        self.before: dict[int, dict[str, float]] = {}
        self.new_run: set[int] = set()
        self.armed: set[int] = set()

    def add(self, s: StepSpan) -> None:
        i = len(self.end)
        self.end.append(s.end_time)
        self.step.append(s.step_s)
        self.iteration.append(s.iteration)
        self.n.append(s.n)
        if s.after_s:
            self.after[i] = dict(s.after_s)
        if s.before_s:
            self.before[i] = dict(s.before_s)
        if s.new_run:
            self.new_run.add(i)
        if s.armed:
            self.armed.add(i)

    def by_end_time(self) -> Iterator[StepSpan]:
        """The spans in end-time order (the order they were added in, where that is it), one at a time."""
        end = self.end
        in_order = all(end[i] <= end[i + 1] for i in range(len(end) - 1))
        for i in range(len(end)) if in_order else sorted(range(len(end)), key=end.__getitem__):
            yield StepSpan(self.iteration[i], end[i], self.step[i], self.n[i], self.after.get(i, {}),
                           i in self.new_run, self.before.get(i, {}), i in self.armed)


def phase_seconds(timers: Mapping[str, TimerValue],
                  names: Mapping[str, str] = PHASE_TIMERS) -> dict[str, float]:
    """kind -> seconds from a record's timers (``TimerValue``-like: ``max_ms``, ``per_rank``): the
    slowest rank's time, which the training loop waits for. ``names``: timer -> kind
    (PHASE_TIMERS: pauses after the record's step; PAUSE_BEFORE_TIMERS: before it)."""
    out: dict[str, float] = {}
    for name, kind in names.items():
        tv = timers.get(name)
        if tv is None:
            continue
        values = [v for v in (getattr(tv, "max_ms", None), *getattr(tv, "per_rank", {}).values())
                  if v is not None and v >= 0]
        if values:
            out[kind] = out.get(kind, 0.0) + max(values) / 1e3
    return out


def _new_run(prev: StepSpan, cur: StepSpan, log_interval: int | None) -> bool:
    if cur.new_run or cur.iteration <= prev.iteration:
        return True
    # Megatron-LM logs the first iteration of every run, fresh or resumed: one iteration, at a number
    # that is not a multiple of the log interval (a run's later logs are).
    return bool(log_interval and log_interval > 1 and cur.n == 1 and cur.iteration % log_interval)


class _Booking:
    """The parts of the job's time, and what of them this call's run trained or redid itself (an
    incident's or a capture's cost comes out of its own run's time, never an earlier run's)."""

    def __init__(self, armed_step_s: float | None) -> None:
        self.parts = dict.fromkeys(KINDS, 0.0)
        self.own = {TRAINING: 0.0, REDONE: 0.0, PROFILING: 0.0}  # PROFILING: the armed steps' excess
        self.armed_step_s = armed_step_s

    def step(self, span: StepSpan, train: float, redo: int) -> None:
        """``train`` seconds of ``span``'s steps, ``redo`` of its ``n`` iterations an earlier run reached:
        an armed step's share above the reference step is perfd's, the rest the job's."""
        ref = self.armed_step_s
        if span.armed and ref is not None and span.step_s > ref > 0:
            perfd = train * (1.0 - ref / span.step_s)
            self.parts[PROFILING] += perfd
            self.own[PROFILING] += perfd
            train -= perfd
        for kind, secs in ((REDONE, train * redo / span.n), (TRAINING, train * (span.n - redo) / span.n)):
            self.parts[kind] += secs
            self.own[kind] += secs

    def take(self, kind: str, cost: float | None, sources: tuple[str, ...] = (TRAINING, REDONE)) -> None:
        """``cost`` seconds moved to ``kind`` from this run's own time of ``sources``, in proportion
        (never more than they hold)."""
        have = sum(self.own[part] for part in sources)
        take = min(have, max(0.0, cost or 0.0))
        if take <= 0.0:
            return
        for part in sources:
            moved = take * self.own[part] / have
            self.own[part] -= moved
            self.parts[part] -= moved
        self.parts[kind] += take


def job_goodput(spans: Iterable[StepSpan], *, started_at: float | None = None,
                incident_cost_s: float | None = None, profiling_s: float | None = None,
                log_interval: int | None = None, stalled_until: float | None = None,
                median_step_s: float | None = None, by_end_time: bool = False,
                prior: Goodput | None = None, armed_step_s: float | None = None,
                armed_incident_cost_s: float | None = None,
                pause_s: Mapping[str, float] | None = None) -> Goodput | None:
    """The job's goodput from its step records (any order: taken by end time), or None without a
    record. ``started_at``: the job's first start-up timestamp. ``stalled_until``: now, for a live job
    that has stopped stepping while its processes are alive. ``median_step_s`` (else the spans'
    median) scales the stall threshold; with it and ``by_end_time`` (the spans come in end-time
    order) the spans are read once, one at a time: a long run's are never all held. ``prior``: the
    goodput of the job's earlier runs, up to the end of the last one (perfd.analytics.run.runs: their
    records are no longer held): these spans are a new run, the time from its end to their first step
    is the restart, and ``started_at`` is the earlier runs' (not these spans' start-up).
    ``armed_step_s``: the steady step an armed span's steps are measured against (their excess over
    it is profiling); None: armed spans book as any other. ``incident_cost_s`` and ``profiling_s``
    (the captures' excess, outside the armed spans) come out of these spans' own training and redone
    time; ``armed_incident_cost_s`` (incidents among the armed steps: slower than the armed level) out of
    the armed steps' excess. ``pause_s``: the loop's own pauses at a cadence by part (checkpoint,
    evaluation, cadence), their excess over the steady step: out of these spans' own time too."""
    kept = (s for s in spans if s.step_s >= 0 and s.n >= 1)
    ordered: Iterable[StepSpan]
    if by_end_time and median_step_s is not None:
        ordered, med = kept, median_step_s
    else:
        listed: Sequence[StepSpan] = sorted(kept, key=lambda s: s.end_time)
        if not listed:
            return None
        ordered, med = listed, (median_step_s if median_step_s is not None
                                else statistics.median(s.step_s for s in listed))
    it = iter(ordered)
    first = next(it, None)
    if first is None:
        return None
    book = _Booking(armed_step_s)
    parts = book.parts
    notes: list[str] = []
    stall_min = max(GOODPUT_STALL_FLOOR_S.value, GOODPUT_STALL_STEPS.value * med)
    first_start = first.end_time - first.n * first.step_s
    start = first_start
    runs, reached, run_floor = 1, first.iteration, -1  # run_floor: earlier runs reached this iteration
    if prior is not None:
        for kind, secs in prior.parts.items():
            parts[kind] = parts.get(kind, 0.0) + secs
        notes.extend(prior.notes)
        start, runs = prior.start_time, prior.runs + 1
        run_floor = prior.reached if prior.reached is not None else -1
        reached = max(reached, run_floor)
        gap = max(0.0, first_start - prior.end_time)
        for kind, secs in first.before_s.items():  # a pause the new run's hook announced before it
            if kind in parts and secs > 0:
                take = min(gap, secs)
                parts[kind] += take
                gap -= take
        parts[RESTART] += gap
        start = min(start, first_start)
    elif started_at is not None and started_at < first_start:
        parts[STARTUP], start = first_start - started_at, started_at
    elif started_at is None:
        notes.append("no start-up time (none logged, or the job's first iterations are no longer held): "
                     "the wall time starts at the first step held")
    redo = min(first.n, max(0, run_floor - (first.iteration - first.n))) if run_floor >= 0 else 0
    book.step(first, first.n * first.step_s, redo)
    last = first
    for prev, cur in itertools.pairwise(itertools.chain((first,), it)):
        last = cur
        window = cur.end_time - prev.end_time
        train = min(window, cur.n * cur.step_s)
        left = window - train
        for kind, secs in (*prev.after_s.items(), *cur.before_s.items()):
            if kind not in parts or not secs > 0:  # only the pause kinds, and only real times
                continue
            take = min(left, secs)
            parts[kind] += take
            left -= take
        if _new_run(prev, cur, log_interval):
            runs += 1
            run_floor = max(run_floor, reached)
            parts[RESTART] += left
        elif left > stall_min:
            parts[STALL] += left
        else:
            parts[OTHER] += left
        # The part of the record's iterations an earlier run had already trained.
        redo = min(cur.n, max(0, run_floor - (cur.iteration - cur.n))) if run_floor >= 0 else 0
        book.step(cur, train, redo)
        reached = max(reached, cur.iteration)
    end = last.end_time
    for kind, secs in last.after_s.items():  # a save after the last logged step (the final one)
        if kind not in parts or not secs > 0:
            continue
        parts[kind] += secs
        end += secs
    if stalled_until is not None and stalled_until > end:
        parts[STALL] += stalled_until - end
        end = stalled_until
    book.take(INCIDENT, incident_cost_s)
    book.take(INCIDENT, armed_incident_cost_s, (PROFILING,))
    book.take(PROFILING, profiling_s)
    for kind, secs in (pause_s or {}).items():
        if kind in parts:
            book.take(kind, secs)
    return Goodput(end - start, parts, start, end, runs, notes, reached)


def with_incidents(gp: Goodput, incident_s: float) -> Goodput:
    """``gp`` with its incident part ``incident_s``: the cost of the incidents the job lists. The live
    aggregator keeps an incident once seen, where a later analysis may no longer find it (the warm-up
    window grows over an early one): the parts then follow the incidents shown, the difference moving
    between training and incident (never past either)."""
    parts = dict(gp.parts)
    have, train = parts.get(INCIDENT, 0.0), parts.get(TRAINING, 0.0)
    move = min(max(0.0, incident_s) - have, train)  # > 0: from training to incident
    if abs(move) < 1e-9:
        return gp
    parts[INCIDENT], parts[TRAINING] = have + move, train - move
    return replace(gp, parts=parts)


def with_stall(gp: Goodput, stalled_s: float) -> Goodput:
    """``gp`` of a job that has not stepped for ``stalled_s`` while its processes hold their GPUs: that
    time added as stall, to the parts and the wall alike."""
    if stalled_s <= 0:
        return gp
    parts = {**gp.parts, STALL: gp.parts.get(STALL, 0.0) + stalled_s}
    return replace(gp, parts=parts, wall_s=gp.wall_s + stalled_s, end_time=gp.end_time + stalled_s)


def metric_rows(job: str, gp: Goodput, ratio_name: str, time_name: str
                ) -> list[tuple[dict[str, str], str, float]]:
    """/metrics rows of a job's goodput: the ratio and the seconds of every kind (0 included: a kind
    that took no time is a fact, and Prometheus rates need the series before it grows)."""
    rows: list[tuple[dict[str, str], str, float]] = []
    ratio = gp.ratio
    if ratio is not None:
        rows.append(({"job_name": job}, ratio_name, float(ratio)))
    for kind in KINDS:
        rows.append(({"job_name": job, "kind": kind}, time_name, float(gp.parts.get(kind, 0.0))))
    return rows


def headline_text(gp: Goodput | None) -> str | None:
    """One line for a report's headline: the ratio, the wall time and the largest non-training
    parts, e.g. "goodput 70% of 155 s (start-up 30 s, incident 17 s)"."""
    ratio = gp.ratio if gp is not None else None
    if gp is None or ratio is None:
        return None
    lost = sorted(((k, v) for k, v in gp.parts.items() if k != TRAINING and v >= 0.5),
                  key=lambda kv: -kv[1])[:3]
    tail = ", ".join(f"{k} {_dur(v)}" for k, v in lost)
    return f"goodput {ratio:.0%} of {_dur(gp.wall_s)}" + (f" ({tail})" if tail else "")


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
