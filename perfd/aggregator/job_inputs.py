"""What the job store (perfd/aggregator/jobs.py) takes in besides records: who stands behind a writer of
a job (given at construction) and what a job's analysis reads of the aggregator's other parts (given
with each analysis: those parts read the store, so the store cannot be built with them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from perfd.analytics.breakdown.bottleneck import GpmReading, GpmWhen
from perfd.analytics.breakdown.diagnosis import TimelineClass
from perfd.analytics.incidents.cadence import PauseSighting

Standing = Callable[[str, str], int]  # (job, agent) -> its standing as a writer of the job


class AnalysisInputs(Protocol):
    """What a job's analysis reads beside its step records, from the aggregator's other parts
    (perfd.aggregator.job_analyses gives it, at each analysis): the windows its captures disturbed
    (iterations ending inside one, or the step after, are marked disturbed, whatever the source of
    the records); for the run whose figures are reported (``span``: from, to, epoch s;
    perfd.analytics.run.runs) the GPM of its GPUs and the class its latest capture supports; and the
    model of its GPUs as their process lists name them (asked while a job has no model from its
    agents' series: a job seen only through the engine); what its ranks showed while it was between
    steps (which work the loop's own pauses at a cadence were)."""

    def capture_windows(self, job: str) -> list[tuple[float, float]]: ...

    def class_inputs(self, job: str, span: tuple[float | None, float | None]
                     ) -> tuple[GpmReading | None, TimelineClass | None, GpmWhen]: ...

    def placed_gpu(self, job: str) -> str | None: ...

    def pause_sightings(self, job: str) -> tuple[PauseSighting, ...]: ...


class NoInputs:
    """The inputs of an analysis run on the job store alone (tests, tools): no capture, no GPM, no
    placed GPU."""

    def capture_windows(self, job: str) -> list[tuple[float, float]]:
        return []

    def class_inputs(self, job: str, span: tuple[float | None, float | None]
                     ) -> tuple[GpmReading | None, TimelineClass | None, GpmWhen]:
        return None, None, GpmWhen.STEPPING  # no GPM: no vote it dates

    def placed_gpu(self, job: str) -> str | None:
        return None

    def pause_sightings(self, job: str) -> tuple[PauseSighting, ...]:
        return ()


NO_INPUTS = NoInputs()
