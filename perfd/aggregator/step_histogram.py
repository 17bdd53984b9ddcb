"""The cumulative step-time histogram of a job (perfd_job_step_duration_seconds on /metrics), fed by the job
store (perfd/aggregator/jobs.py) once per iteration: a job-level record (a Megatron log's) as it
arrives; an iteration the job's ranks report one by one (the step hook) or folded by the engine's root
(a fold that grows as the shards' partials come in) once the next iteration begins, with its slowest
rank's step — what the iteration took, whatever arrived first."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from perfd.core.model import StepRecord

# Bucket upper bounds (s) of the step-time histogram: 50 ms to 2 min, about ×1.5 apart.
STEP_BUCKETS_S: tuple[float, ...] = (0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.45, 0.7, 1.0, 1.5, 2.25, 3.5, 5.0,
                                     7.5, 11.0, 17.0, 25.0, 40.0, 60.0, 120.0)


@dataclass
class StepHistogram:
    """Cumulative step-time histogram of a job (Prometheus semantics: counts only grow), fed once
    per job-level step record; retention never takes counts back."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(STEP_BUCKETS_S) + 1))
    total_s: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        i = next((k for k, b in enumerate(STEP_BUCKETS_S) if seconds <= b), len(STEP_BUCKETS_S))
        self.counts[i] += 1
        self.total_s += seconds
        self.n += 1


def slowest_step_s(records: Iterable[StepRecord | None]) -> float | None:
    """An iteration's step (s) from its rank records or folds: the slowest (None: none has one)."""
    steps = [r.step_time_ms for r in records if r is not None and r.step_time_ms is not None
             and math.isfinite(r.step_time_ms) and r.step_time_ms >= 0]
    return max(steps) / 1e3 if steps else None
