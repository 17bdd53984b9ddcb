"""A loop's own pauses at a cadence: the evaluation or checkpoint save a training loop runs every N
steps, between two steps, without announcing it (``with hook.phase("checkpoint"):``).

Such a pause shows as one slow step whose excess lies outside the step (the step hook's time between the
steps; the step itself runs at its steady time), and would be an incident that nothing explains (its GPU
and timers show nothing unusual: the loop is doing its own work). Here it is named for what it is: a slow
step of at most ``PAUSE_MAX_STEPS`` steps, most of whose excess is outside the step, recurring every N
steps — at least twice at the same interval, the second occurrence naming the first. With only two
occurrences they must also fall where a loop's ``step % N == 0`` puts them (the step N·k, or the one after
it): two one-off stalls N steps apart are not a cadence. The pauses of one cadence are the same work,
similar in length (``CADENCE_SIZE_FACTOR``), and a loop's cadence goes on: one whose next occurrence was
an ordinary step is not one (a one-off stall halfway between two pauses every 100 steps makes three
pauses "every 50" until step 250 runs at its steady time).

What the aggregator saw of the ranks while the job was between steps (:class:`PauseSighting`: its GPU's
utilisation, its process's disk writes) tells which work it was: disk writes, a checkpoint save; the GPU
busy with no step ending, an evaluation; both or neither, a pause that cannot be told apart (goodput's own
``cadence`` part). Typed here, worded in perfd.report.finding_text. Pure: no I/O.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from perfd.analytics import thresholds as th
from perfd.core.record_json import JsonWritten

PAUSE_MAX_STEPS = int(th.PAUSE_MAX_STEPS.value)
MIN_EVERY = int(th.CADENCE_MIN_EVERY.value)
SIZE_FACTOR = th.CADENCE_SIZE_FACTOR.value
OUTSIDE_SHARE = th.EXPLAINS_SHARE.value  # the time outside the step explains the step's excess
WRITES_BPS = th.PAUSE_WRITES_BPS.value
GPU_BUSY = th.PAUSE_GPU_BUSY.value
# A pause at the step a loop's counter names (step % N == 0) or at the one after it (the hook puts a
# pause after step N on step N+1's period): where two occurrences may fall to be a cadence.
COUNTER_PHASES = (0, 1)
# A cadence's next occurrence is among the next few pauses (one-off stalls between two are few): the
# intervals tried from each pause, so that a long run's thousands of pauses are read in linear time.
NEXT_TRIED = 8


class PausePart(str, enum.Enum):
    """Which of goodput's parts a cadence's time is booked under (the value is the part's name,
    perfd.analytics.steps.goodput)."""

    CHECKPOINT = "checkpoint"
    EVALUATION = "evaluation"
    UNTOLD = "cadence"  # neither seen, or both in the same pause: which is which cannot be told


class SeenKind(str, enum.Enum):
    """What the aggregator saw of a rank during a cadence's pauses."""

    DISK_WRITES = "disk_writes"  # its process wrote to disk (bytes/s: the most seen)
    NO_DISK_WRITES = "no_disk_writes"  # its process's writes were read and stayed low (bytes/s)
    GPU_BUSY = "gpu_busy"  # its GPU ran kernels while no step ended (utilisation: the most seen)
    GPU_IDLE = "gpu_idle"  # its GPU was read and stayed idle (utilisation: the most seen)


@dataclass(frozen=True, slots=True)
class PauseSighting:
    """One rank as the aggregator saw it at ``time`` (its clock, epoch s) while the job was between
    steps: its GPU's utilisation and its process's disk writes, None where not read."""

    time: float
    rank: int
    gpu_util: float | None = None
    write_bytes_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class PauseSeen(JsonWritten):
    """One item of what was seen during a cadence's pauses: its kind, the rank, the most seen value and
    how many sightings it is read from."""

    kind: SeenKind
    rank: int
    value: float
    n: int


@dataclass(frozen=True, slots=True)
class Pause:
    """One pause: the step whose period holds it (``iteration``, to ``last_iteration``), the time it took
    beyond the steady step (s), and when it began and ended (the step records' own clock, epoch s)."""

    iteration: int
    seconds: float
    start_time: float | None = None
    end_time: float | None = None
    last_iteration: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"iteration": self.iteration, "last_iteration": self.last_iteration or self.iteration,
                "seconds": self.seconds, "start_time": self.start_time, "end_time": self.end_time}


@dataclass(frozen=True, slots=True)
class CadencePause:
    """A pause the loop takes every ``every`` steps: its occurrences, the goodput part it is booked under
    and what was seen during it."""

    every: int
    pauses: tuple[Pause, ...]
    part: PausePart = PausePart.UNTOLD
    seen: tuple[PauseSeen, ...] = ()

    @property
    def id(self) -> str:
        return f"cadence-{self.every}"

    @property
    def iterations(self) -> tuple[int, ...]:
        return tuple(p.iteration for p in self.pauses)

    @property
    def typical_s(self) -> float:
        return float(statistics.median(p.seconds for p in self.pauses))

    @property
    def total_s(self) -> float:
        return sum(p.seconds for p in self.pauses)

    def covers(self, iteration: int) -> bool:
        return any(p.iteration <= iteration <= (p.last_iteration or p.iteration) for p in self.pauses)

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "every": self.every, "part": self.part.value, "typical_s": self.typical_s,
                "total_s": self.total_s, "pauses": [p.to_json() for p in self.pauses],
                "seen": [s.to_json() for s in self.seen]}


def outside_explains(steps_ms: Sequence[float | None], outside_shares: Sequence[float | None],
                     excess_ms: float) -> bool:
    """A slow stretch of at most PAUSE_MAX_STEPS steps whose time outside the step (the step hook's,
    as a share of each step) is most of its excess over the steady step: a pause between the steps."""
    if not steps_ms or len(steps_ms) > PAUSE_MAX_STEPS or excess_ms <= 0:
        return False
    outside = [s * o for s, o in zip(steps_ms, outside_shares, strict=True)
               if s is not None and o is not None]
    return bool(outside) and sum(outside) >= OUTSIDE_SHARE * excess_ms


def _similar(sizes: Sequence[float], size: float) -> bool:
    mid = statistics.median(sizes)
    return mid > 0 and mid / SIZE_FACTOR <= size <= mid * SIZE_FACTOR


def _walk(pauses: Sequence[Pause], at: dict[int, int], first: int, every: int) -> list[int]:
    """The pauses every ``every`` steps from ``pauses[first]`` on, while each is like those just before it."""
    members = [first]
    nxt = pauses[first].iteration + every
    while (j := at.get(nxt)) is not None and _similar([pauses[i].seconds for i in members[-NEXT_TRIED:]],
                                                      pauses[j].seconds):
        members.append(j)
        nxt += every
    return members


def find_cadences(pauses: Iterable[Pause], stepped_to: int | None = None) -> list[CadencePause]:
    """The cadences among ``pauses`` (the run's slow steps that are pauses between the steps), each
    pause in at most one: the one with the most occurrences first (ties: the shorter interval).
    ``stepped_to``: the last iteration the run has stepped to (a cadence whose next occurrence is at or
    before it, and no pause, met an ordinary step there: it was none)."""
    left = sorted(pauses, key=lambda p: p.iteration)
    out: list[CadencePause] = []
    while len(left) >= 2:
        at = {p.iteration: i for i, p in enumerate(left)}
        best: list[int] = []
        best_every = 0
        for a in range(len(left)):
            for b in range(a + 1, min(len(left), a + 1 + NEXT_TRIED)):
                every = left[b].iteration - left[a].iteration
                prev = at.get(left[a].iteration - every)
                if every < MIN_EVERY or (prev is not None
                                         and _similar([left[prev].seconds], left[a].seconds)):
                    continue  # too often; or not where this cadence starts (walked from its start)
                members = _walk(left, at, a, every)
                if len(members) < 2:
                    continue
                nxt = left[members[-1]].iteration + every
                if stepped_to is not None and nxt <= stepped_to and nxt not in at:
                    continue  # the loop stepped on where the cadence says it pauses: no cadence
                if len(members) == 2 and left[a].iteration % every not in COUNTER_PHASES:
                    continue  # two stalls some steps apart: not where a loop's counter puts its work
                if (len(members), -every) > (len(best), -best_every):
                    best, best_every = members, every
        if not best:
            break
        out.append(CadencePause(best_every, tuple(left[i] for i in best)))
        taken = set(best)
        left = [p for i, p in enumerate(left) if i not in taken]
    return sorted(out, key=lambda c: c.pauses[0].iteration)


def part_seconds(cadences: Iterable[CadencePause]) -> dict[str, float]:
    """Goodput part -> the seconds the cadences' pauses took beyond the steady step."""
    out: dict[str, float] = {}
    for c in cadences:
        out[c.part.value] = out.get(c.part.value, 0.0) + c.total_s
    return out


def _during(c: CadencePause, sightings: Iterable[PauseSighting]) -> list[PauseSighting]:
    spans = [(p.start_time, p.end_time) for p in c.pauses
             if p.start_time is not None and p.end_time is not None]
    return [s for s in sightings if any(t0 <= s.time <= t1 for t0, t1 in spans)]


def name_part(c: CadencePause, sightings: Iterable[PauseSighting]) -> CadencePause:
    """The cadence with what was seen during its pauses and the part that tells: disk writes, a
    checkpoint save; the GPU busy with no step ending, an evaluation; both or neither, UNTOLD."""
    seen: list[PauseSeen] = []
    by_rank: dict[int, list[PauseSighting]] = {}
    for s in _during(c, sightings):
        by_rank.setdefault(s.rank, []).append(s)
    writes = busy = False
    for rank, ss in sorted(by_rank.items()):
        wr = [s.write_bytes_per_s for s in ss if s.write_bytes_per_s is not None]
        if wr:
            hi = max(wr)
            writes = writes or hi >= WRITES_BPS
            seen.append(PauseSeen(SeenKind.DISK_WRITES if hi >= WRITES_BPS else SeenKind.NO_DISK_WRITES,
                                  rank, hi, len(wr)))
        gu = [s.gpu_util for s in ss if s.gpu_util is not None]
        if gu:
            hi = max(gu)
            busy = busy or hi >= GPU_BUSY
            kind = SeenKind.GPU_BUSY if hi >= GPU_BUSY else SeenKind.GPU_IDLE
            seen.append(PauseSeen(kind, rank, hi, len(gu)))
    part = (PausePart.CHECKPOINT if writes and not busy else PausePart.EVALUATION if busy and not writes
            else PausePart.UNTOLD)
    return replace(c, part=part, seen=tuple(seen))
