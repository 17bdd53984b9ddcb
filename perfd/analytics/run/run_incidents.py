"""Which of a run's iterations an incident or a perfd capture disturbed, read off the run's table
(perfd.analytics.steps.iteration_table): each such iteration taken out of the steady state, saying
why, and given the time it lost against the steady median; with the per-row reads the run-wide
passes of perfd.analytics.run.run_analysis take from the table (an iteration's last row, its
straggler flags, each step's work)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from perfd.analytics.incidents.detect import DETECTION_FIELDS, Detection, detect_incidents
from perfd.analytics.steps.provenance import Code, cite
from perfd.analytics.steps.steady import Exclusion, SteadyState

if TYPE_CHECKING:  # run_analysis builds the table and calls these
    from perfd.analytics.steps.iteration import IterationResult
    from perfd.analytics.steps.iteration_table import Table


class RowFlags(NamedTuple):
    """The two straggler facts persistence reads (stragglers.StragglerFlags), from a table row."""

    flagged_ranks: list[int]
    compute_spread_flagged: bool | None


def straggler_flags(table: Table[IterationResult], i: int) -> RowFlags:
    """Row ``i``'s straggler facts, taken from the last row of its iteration (as a dict of results
    keyed by iteration held them)."""
    j = table.last_index_of(table.get(i, "iteration"))
    j = i if j is None else j
    return RowFlags(table.get(j, "straggler_candidate_ranks"),
                    table.get(j, "straggler_compute_spread_flagged"))


V = TypeVar("V")


class ByIteration(Mapping[int, V]):
    """iteration -> a value of its row; for a repeated iteration, its last row (as a dict built
    over the rows would keep), without building that dict."""

    def __init__(self, table: Table[IterationResult], value: Callable[[int], V]) -> None:
        self.table, self.value = table, value

    def __getitem__(self, iteration: int) -> V:
        i = self.table.last_index_of(iteration)
        if i is None:
            raise KeyError(iteration)
        return self.value(i)

    def __iter__(self) -> Iterator[int]:
        return iter(dict.fromkeys(self.table.column("iteration")))

    def __len__(self) -> int:
        return len(dict.fromkeys(self.table.column("iteration")))


def step_work(steps: Sequence[float | None], tflops: Sequence[float | None]) -> list[float | None]:
    """Each step's work (its model FLOPs per GPU: TFLOP/s × seconds), where the source counts it per
    step (the step hook's per-step FLOPs); perfd.analytics.steps.windows reads steps per unit of it."""
    return [t * s * 1e9 if t is not None and s is not None else None
            for s, t in zip(steps, tflops, strict=True)]


def mark_incidents(table: Table[IterationResult], disturbed: Sequence[int],
                   steady: SteadyState, world: int | None, new_normal_at: int | None = None,
                   work: Sequence[float | None] | None = None, cpu_only: bool = False) -> Detection:
    """Find the incidents and perfd's capture disturbances, take their iterations out of the steady
    state (saying which), and note each incident iteration's time lost against the steady median."""
    first = steady.warmup_records
    steps = [None if disturbed[i] else s for i, s in enumerate(table.column("step_time_ms")) if i >= first]
    found = detect_incidents(table.project(DETECTION_FIELDS),
                             ByIteration(table, lambda i: table.get(i, "end_time")),
                             ByIteration(table, lambda i: bool(disturbed[i])),
                             first, steady.reference_step_ms, world, new_normal_at, steps,
                             work[first:] if work is not None else None, cpu_only)
    ref = found.reference_ms
    for inc, lost in [*((i, True) for i in found.incidents), *((d, False) for d in found.disturbances)]:
        for iteration in range(inc.first_iteration, inc.last_iteration + 1):
            i = table.last_index_of(iteration)
            if i is None:
                continue
            step = table.get(i, "step_time_ms")
            if lost and step is not None and ref is not None and not disturbed[i]:
                table.put(i, incident_lost_ms=step - ref)
            reason = cite(Code.IN_INCIDENT, inc.id) if lost else cite(Code.IN_CAPTURE, inc.id)
            table.put(i, steady_state=False, excluded_reason=reason)
            steady.steady[iteration] = False
            steady.excluded[iteration] = reason
            steady.kinds[iteration] = Exclusion.INCIDENT if lost else Exclusion.CAPTURE
            steady.refs[iteration] = inc.id
    for cad in found.pauses:  # the loop's own pauses: out of the steady state, their time not lost
        for p in cad.pauses:
            for iteration in range(p.iteration, (p.last_iteration or p.iteration) + 1):
                i = table.last_index_of(iteration)
                if i is None:
                    continue
                reason = cite(Code.IN_PAUSE, cad.id)
                table.put(i, steady_state=False, excluded_reason=reason)
                steady.steady[iteration] = False
                steady.excluded[iteration] = reason
                steady.kinds[iteration] = Exclusion.PAUSE
                steady.refs[iteration] = cad.id
    return found
